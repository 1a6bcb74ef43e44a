// Command step-agent is what jetway runs inside a step pod: see package
// stepagent for its commands and the files it keeps.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/volumes"
)

func main() {
	if len(os.Args) < 2 {
		fail(stepagent.ExitUsage, errors.New("usage: step-agent install|pid1|prepare|run|tail|abort|forget|serve|serve-daemon|supervise|volumes ..."))
	}
	if err := dispatch(os.Args[1], os.Args[2:]); err != nil {
		code := 1
		switch {
		case errors.Is(err, stepagent.ErrSpecDiffers):
			code = stepagent.ExitSpecDiffers
		case errors.Is(err, stepagent.ErrNotPrepared):
			code = stepagent.ExitNotPrepared
		case errors.Is(err, stepagent.ErrNotStarted):
			code = stepagent.ExitNotStarted
		case errors.Is(err, errUsage):
			code = stepagent.ExitUsage
		}
		fail(code, err)
	}
}

var errUsage = errors.New("usage")

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "step-agent:", err)
	os.Exit(code)
}

func dispatch(cmd string, args []string) error {
	root := stepagent.RootDir()
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	specBytes := fs.Int("spec-bytes", -1, "bytes of spec JSON on stdin")
	inputBytes := fs.Int("inputs-bytes", 0, "bytes of inputs JSON on stdin, after the spec")
	offset := fs.Int64("offset", 0, "log offset to tail from")
	listen := fs.String("listen", ":7788", "volume sidecar address")
	run := fs.String("run", "", "a run of a sandbox pod: its folder under runs/ is the root")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *run != "" {
		var err error
		if root, err = stepagent.RunRoot(root, *run); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	switch cmd {
	case "install":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w: install DEST", errUsage)
		}
		return stepagent.Install(fs.Arg(0))
	case "pid1":
		stepagent.Pid1()
		return nil
	case "prepare":
		return prepare(root, *specBytes)
	case "run":
		if *specBytes >= 0 {
			if err := prepare(root, *specBytes); err != nil {
				return err
			}
		}
		inputs, err := stepagent.ReadStdin(*inputBytes)
		if err != nil {
			return err
		}
		if err := stepagent.Start(root, inputs); err != nil {
			return err
		}
		return stepagent.Tail(root, *offset, os.Stdout)
	case "tail":
		return stepagent.Tail(root, *offset, os.Stdout)
	case "abort":
		return stepagent.Abort(root)
	case "serve":
		return stepagent.Connect(root, os.Stdin, os.Stdout)
	case "serve-daemon":
		return stepagent.Daemon(root)
	case "forget":
		if *run == "" {
			return fmt.Errorf("%w: forget needs --run", errUsage)
		}
		return stepagent.Forget(root)
	case "supervise":
		return stepagent.Supervise(root)
	case "volumes":
		return serveVolumes(*listen, root)
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

func prepare(root string, n int) error {
	if n < 0 {
		return fmt.Errorf("%w: --spec-bytes is required", errUsage)
	}
	raw, err := stepagent.ReadStdin(n)
	if err != nil {
		return err
	}
	return stepagent.Prepare(root, raw)
}

// serveVolumes runs the volume sidecar until TERM or INT.
func serveVolumes(addr, root string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := volumes.Listen(addr, root)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "step-agent: serving volumes of %s on %s\n", root, addr)
	<-ctx.Done()
	return s.Kill()
}
