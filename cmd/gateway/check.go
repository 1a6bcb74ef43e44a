package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetway-ci/jetway/targets"
)

func checkCommand() *cobra.Command {
	var (
		pol         targets.Policy
		timeout     time.Duration
		holderClass string
	)
	cmd := &cobra.Command{
		Use:   "check DIR",
		Short: "Validate and health-check every target in DIR once (a preflight before mounting it)",
		Long: "check reads DIR as `gateway run` reads --targets-dir, checks every valid target once\n" +
			"(readiness and every permission jetway needs), prints one row per target and exits 1\n" +
			"if any target is unusable.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("check takes exactly one argument, the targets directory")}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&pol.AllowExecPlugins, "allow-exec-plugins", false, "accept exec credential plugins")
	cmd.Flags().BoolVar(&pol.AllowAuthProviders, "allow-auth-providers", false, "accept auth-providers")
	cmd.Flags().BoolVar(&pol.AllowInsecureTLS, "allow-insecure-tls", false, "accept insecure-skip-tls-verify")
	cmd.Flags().BoolVar(&pol.AllowExternalFiles, "allow-external-files", false, "accept files outside DIR")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "bound on each target's check")
	cmd.Flags().StringVar(&holderClass, "volume-holder-storage-class", "", "the gateway's volume-holder-storage-class: "+
		"the targets that keep their volume holder's volumes on a claim of it are checked for persistentvolumeclaims too")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		src := targets.NewSource(targets.SourceOptions{Dir: args[0], Policy: pol}, nil)
		results, _, err := src.Read()
		if err != nil {
			return usageError{err}
		}
		rows := checkAll(cmd.Context(), results, timeout, holderClass)
		if bad := printChecks(cmd.OutOrStdout(), rows); bad > 0 {
			return fmt.Errorf("%d of %d targets unusable", bad, len(rows))
		}
		return nil
	}
	return cmd
}

// printChecks prints one row per target checked and returns how many are
// unusable.
func printChecks(out io.Writer, rows []checkRow) int {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TARGET\tNAMESPACE\tSERVER\tRESULT\tPROBLEMS")
	bad := 0
	for _, r := range rows {
		if r.problem != "" {
			bad++
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.name, dash(r.namespace), dash(r.server), r.result(), dash(r.problem))
	}
	w.Flush()
	return bad
}

type checkRow struct {
	name, namespace, server, problem string
}

func (r checkRow) result() string {
	if r.problem == "" {
		return "ok"
	}
	return "UNUSABLE"
}

// checkAll checks the valid targets concurrently and returns a row for
// every entry, sorted by name.
func checkAll(ctx context.Context, results map[string]targets.Result, timeout time.Duration, holderClass string) []checkRow {
	rows := make([]checkRow, 0, len(results))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, res := range results {
		if res.Err != nil {
			rows = append(rows, checkRow{name: name, problem: res.Err.Error()})
			continue
		}
		wg.Go(func() {
			h := targets.Check(ctx, res.Config, timeout, holderClass)
			mu.Lock()
			defer mu.Unlock()
			rows = append(rows, checkRow{name: name, namespace: res.Config.Meta.Namespace,
				server: res.Config.Server, problem: h.Describe()})
		})
	}
	wg.Wait()
	slices.SortFunc(rows, func(a, b checkRow) int { return strings.Compare(a.name, b.name) })
	return rows
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
