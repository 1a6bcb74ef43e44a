package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/wire"
)

const (
	// defaultURL is where the gateway's CLI looks without --url or JETWAY_URL.
	defaultURL = "http://127.0.0.1:8080"
	// runningWithin bounds the wait for the targets' first good checks,
	// which come within a second of the gateway's start.
	runningWithin = time.Minute
	// stopWithin bounds the gateway's graceful stop (its shutdown-timeout
	// is 15 s) before it is killed.
	stopWithin = 20 * time.Second
)

// gatewayProcess is `gateway run`, started by the demo.
type gatewayProcess struct {
	// ctx ends when the process exits, with a *gatewayExited cause, or
	// when the demo's own context does.
	ctx  context.Context
	stop context.CancelFunc // sends SIGTERM
	done chan struct{}      // closed once the process has exited
}

// gatewayExited is why the story stops when the gateway exits under it.
type gatewayExited struct {
	err      error
	log, end string // its log's path and last lines
}

func (e *gatewayExited) Error() string {
	return fmt.Sprintf("the gateway exited (%v); the end of %s:\n%s", e.err, e.log, e.end)
}

func (d *demo) logPath() string { return filepath.Join(d.o.dir, "gateway.log") }

// stateNS is the namespace of the first cluster that keeps the gateway's
// step records and leases.
const stateNS = "jetway"

// stateNamespace makes the namespace where the gateway keeps its steps
// (its state namespace: docs/steps.md) on c, and returns the flags that
// name it, with c's admin kubeconfig: in a cluster, the chart gives the
// gateway its own namespace instead.
func (d *demo) stateNamespace(ctx context.Context, c *cluster.Cluster) ([]string, error) {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: stateNS}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("state namespace: %w", err)
	}
	d.story.line("It keeps its steps (their records, its lease) in namespace %s of %s.", stateNS, c.Name)
	return []string{"--state-kubeconfig", c.AdminKubeconfig(), "--state-namespace", stateNS}, nil
}

// startGateway runs `gateway run --no-auth` on the targets directory, its
// output going to the log file, with the flags of its state namespace.
// Stop it with stopGateway.
func (d *demo) startGateway(ctx context.Context, targetsDir string, state []string) (*gatewayProcess, error) {
	logFile, err := os.Create(d.logPath())
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "--listen", d.o.listen, "--targets-dir", display(targetsDir), "--no-auth", "--health-interval", "5s"}, state...)
	d.story.command(append([]string{d.gateway()}, args...)...)
	procCtx, stop := context.WithCancel(context.Background())
	cmd := exec.CommandContext(procCtx, d.gateway(), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopWithin
	// Its own process group: Ctrl-C reaches the demo, which stops the
	// gateway with one SIGTERM (a second signal would make it exit at once).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		stop()
		logFile.Close()
		return nil, fmt.Errorf("start gateway: %w", err)
	}
	gctx, exited := context.WithCancelCause(ctx)
	g := &gatewayProcess{ctx: gctx, stop: stop, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		exited(&gatewayExited{err: err, log: display(d.logPath()), end: lastLines(d.logPath(), 5)})
		close(g.done)
	}()
	return g, nil
}

func (d *demo) stopGateway(g *gatewayProcess) {
	d.story.then("Stopping the gateway.")
	g.stop()
	<-g.done
}

// waitRunning waits until every target is a running worker.
func (d *demo) waitRunning(ctx context.Context, tgts []target) error {
	c, err := client.New(client.Options{URL: d.base})
	if err != nil {
		return err
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, runningWithin)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var names []string
	for _, t := range tgts {
		names = append(names, t.name)
	}
	for {
		workers, err := c.Workers(ctx)
		waiting := slices.DeleteFunc(slices.Clone(names), func(name string) bool {
			return slices.ContainsFunc(workers, func(w wire.Worker) bool { return w.Name == name && w.State == "running" })
		})
		if err == nil && len(waiting) == 0 {
			d.story.line("serving %s; %s running after %s", d.base, strings.Join(names, " and "),
				time.Since(began).Round(100*time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not running after %s (last error: %v); see %s",
				strings.Join(waiting, ", "), runningWithin, err, display(d.logPath()))
		case <-tick.C:
		}
	}
}

// workers runs `gateway workers` and shows its table.
func (d *demo) workers(ctx context.Context) error {
	args := d.cli("workers")
	d.story.command(append([]string{d.gateway()}, args...)...)
	out, err := exec.CommandContext(ctx, d.gateway(), args...).CombinedOutput()
	d.story.block(string(out))
	if err != nil {
		return fmt.Errorf("gateway workers: %w", err)
	}
	return nil
}

// cli is the arguments of a gateway CLI command reaching this demo's
// gateway: --url only where the default would not.
func (d *demo) cli(args ...string) []string {
	if d.base == defaultURL && os.Getenv("JETWAY_URL") == "" {
		return args
	}
	return append(args, "--url", d.base)
}

// gateway is the gateway binary as the printed commands name it (and
// run it: relative paths are to the current folder, as in a shell).
func (d *demo) gateway() string {
	p := display(d.o.gateway)
	if !strings.Contains(p, "/") {
		p = "./" + p // not looked up in $PATH
	}
	return p
}

// lastLines is the end of a file, for an error.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
