// Command jetway-demo starts local clusters, writes one target kubeconfig
// per cluster into a targets directory, runs `gateway run` on them, and
// tears everything down on Ctrl-C. `make demo` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "jetway-demo: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("clusters", 2, "number of local clusters")
	dir := flag.String("dir", ".demo", "folder for the targets directory and admin kubeconfigs")
	gateway := flag.String("gateway", "bin/gateway", "gateway binary")
	listen := flag.String("listen", "127.0.0.1:8080", "gateway listen address")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, cluster.StartupTimeout)
	clusters, err := cluster.StartN(startCtx, *n, "demo")
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		log.Info("stopping clusters")
		cluster.StopAll(clusters)
	}()

	targetsDir := filepath.Join(*dir, "targets")
	if err := os.MkdirAll(targetsDir, 0o700); err != nil {
		return err
	}
	for _, c := range clusters {
		t, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "ci", Rules: targets.RBACRules(targets.Required)})
		if err != nil {
			return err
		}
		path := filepath.Join(targetsDir, c.Name+".kubeconfig")
		if err := os.WriteFile(path, t.Kubeconfig, 0o600); err != nil {
			return err
		}
		log.Info("cluster ready", "cluster", c.Name, "server", c.Server, "target", path)
	}

	cmd := exec.CommandContext(ctx, *gateway, "run", "--listen", *listen, "--targets-dir", targetsDir,
		"--no-auth", "--health-interval", "5s")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	// Its own process group: Ctrl-C reaches the demo, which stops the
	// gateway with one SIGTERM (a second signal would make it exit at once).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	log.Info("starting gateway; Ctrl-C stops it and removes the clusters", "url", "http://"+*listen+"/api/v1/info")
	if err := cmd.Run(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}
