// Command gateway runs jetway: `gateway run` serves the Concourse worker API
// over the targets it owns; `gateway mesh issue` makes a replica's mesh
// certificate; `gateway version` prints what was built.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/jetway-ci/jetway/config"
)

// exitUsage is the status for bad flags or configuration: nothing started.
const exitUsage = 2

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

func execute(args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "gateway",
		Short:         "jetway runs Concourse steps as pods on many Kubernetes clusters",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.Args = cobra.ArbitraryArgs
	root.RunE = helpOrUnknown
	root.AddCommand(runCommand(stderr), workersCommand(), checkCommand(),
		lifecycleCommand("land", "/api/v1/workers/%s/land", "landed",
			"Land a worker: it takes no new work and becomes landed once its step pods finish"),
		lifecycleCommand("retire", "/api/v1/workers/%s/retire", "retiring",
			"Retire a worker: land it, delete everything jetway created on it, forget it"),
		lifecycleCommand("prune", "/api/v1/workers/%s/prune", "pruned",
			"Forget a worker that is not running, until its kubeconfig changes or it is resumed"),
		lifecycleCommand("resume", "/api/v1/targets/%s/resume", "resumed",
			"Undo land, an unfinished retire or prune: the worker takes work again once healthy"),
		streamCommand(), placeCommand(), executeCommand(), targetCommand(), meshCommand(),
		agentCommand(stderr), stepAgentCommand(), versionCommand())

	err := root.Execute()
	var status exitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &status):
		return int(status)
	case errors.Is(err, config.ErrInvalid), errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return 1
	}
}

// usageError marks a bad command line, reported with exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// helpOrUnknown runs a command that only groups others: its help, or a
// usage error naming the unknown command.
func helpOrUnknown(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unknown command %q; see %s --help", args[0], cmd.CommandPath())}
	}
	return cmd.Help()
}

// noArgs is cobra.NoArgs reported as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return usageError{err}
	}
	return nil
}
