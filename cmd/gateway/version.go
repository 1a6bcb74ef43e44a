package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/jetway-ci/jetway/internal/buildinfo"
	"github.com/jetway-ci/jetway/wire"
)

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gateway's version",
		Args:  noArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "gateway %s (worker API %s, %s, client-go %s)\n",
				buildinfo.String(), wire.WorkerVersion, runtime.Version(), depVersion("k8s.io/client-go"))
		},
	}
}

func depVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "unknown"
}
