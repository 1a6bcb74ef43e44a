// Command jetway-demo tells jetway's story on this machine, printing each
// part as it goes: it starts two local clusters and writes a target for
// each, runs `gateway run` on them, lists the workers, runs a step on
// cluster A whose output feeds a step on cluster B, and prints commands to
// try next. It then keeps the gateway running until Ctrl-C (with --once it
// stops after the story) and tears everything down. `make demo` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// options are the demo's flags.
type options struct {
	// dir holds what the demo writes: targets, the steps' requests, a task
	// config and the gateway's log.
	dir       string
	gateway   string
	stepAgent string
	listen    string
	once      bool
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".demo", "folder for the targets, the step requests and the gateway's log")
	flag.StringVar(&o.gateway, "gateway", "bin/gateway", "gateway binary")
	flag.StringVar(&o.stepAgent, "step-agent", "bin/step-agent", "step agent binary for this machine, which the local clusters run in step pods")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:8080", "gateway listen address")
	flag.BoolVar(&o.once, "once", false, "tear down and exit after the story instead of waiting for Ctrl-C")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o, os.Stdout, os.Stderr)
	interrupted := ctx.Err() != nil
	stop()
	if err != nil && !interrupted {
		fmt.Fprintf(os.Stderr, "jetway-demo: %v\n", err)
		os.Exit(1)
	}
}

// demo is one run of the story.
type demo struct {
	o      options
	story  *story
	errOut io.Writer
	base   string // the gateway's URL
}

func run(ctx context.Context, o options, out, errOut io.Writer) error {
	for _, f := range []struct{ flag, path string }{{"--gateway", o.gateway}, {"--step-agent", o.stepAgent}} {
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s: %w (make demo builds it)", f.flag, err)
		}
	}
	base, err := baseURL(o.listen)
	if err != nil {
		return err
	}
	d := &demo{o: o, story: &story{w: out}, errOut: errOut, base: base}
	return d.tell(ctx)
}

// tell runs the story's parts in order; what each started is stopped, in
// reverse order, when it returns.
func (d *demo) tell(ctx context.Context) error {
	d.story.section(1, "Two local Kubernetes clusters",
		"(etcd, kube-apiserver, scheduler and controller-manager each; kwok stands in for",
		"the kubelets and runs each step's process on this machine)")
	clusters, err := d.startClusters(ctx)
	if err != nil {
		return err
	}
	defer d.stopClusters(clusters)
	defer runStepKubelets(clusters, d.o.stepAgent, d.errOut)()

	targetsDir := filepath.Join(d.o.dir, "targets")
	tgts, err := d.writeTargets(ctx, targetsDir, clusters)
	if err != nil {
		return err
	}

	d.story.section(2, "The gateway, serving both targets",
		"(its own JSON logs go to "+display(d.logPath())+")")
	state, err := d.stateNamespace(ctx, clusters[0])
	if err != nil {
		return err
	}
	gw, err := d.startGateway(ctx, targetsDir, state)
	if err != nil {
		return err
	}
	defer d.stopGateway(gw)
	ctx = gw.ctx // ends, with the reason, if the gateway exits
	if err := d.waitRunning(ctx, tgts); err != nil {
		return cause(ctx, err)
	}

	d.story.section(3, "The workers, as `fly workers` lists them")
	if err := d.workers(ctx); err != nil {
		return cause(ctx, err)
	}

	d.story.section(4, "A step on "+tgts[0].cluster+" writes a file; a step on "+tgts[1].cluster+" reads it")
	if err := d.crossClusterSteps(ctx, tgts[0], tgts[1]); err != nil {
		return cause(ctx, err)
	}

	d.story.section(5, "Try next, in another terminal")
	if err := d.tryNext(tgts); err != nil {
		return err
	}
	if d.o.once {
		d.story.say("Done (--once); tearing down.")
		return nil
	}
	d.story.say("Running until Ctrl-C, which stops the gateway and removes both clusters.")
	<-ctx.Done()
	if err := cause(ctx, nil); err != nil {
		return err
	}
	d.story.say("Tearing down.")
	return nil
}

// cause is why ctx ended if the gateway exited (err otherwise): a story
// cut short by a dead gateway says so rather than "context canceled".
func cause(ctx context.Context, err error) error {
	var exited *gatewayExited
	if c := context.Cause(ctx); errors.As(c, &exited) {
		return c
	}
	return err
}

func (d *demo) startClusters(ctx context.Context) ([]*cluster.Cluster, error) {
	began := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, cluster.StartupTimeout)
	defer cancel()
	clusters, err := cluster.StartNamed(startCtx, clusterA, clusterB)
	if err != nil {
		return nil, err
	}
	for _, c := range clusters {
		d.story.line("%-10s %s", c.Name, c.Server)
	}
	d.story.line("started in %s", time.Since(began).Round(100*time.Millisecond))
	return clusters, nil
}

func (d *demo) stopClusters(clusters []*cluster.Cluster) {
	d.story.then("Removing the clusters.")
	cluster.StopAll(clusters)
}

// baseURL is the URL clients reach a listen address at.
func baseURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
