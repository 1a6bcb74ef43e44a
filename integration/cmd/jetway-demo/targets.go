package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// The story's two clusters, and the target the demo makes on each: the
// namespace ci, tagged with the cluster's name so that a step asking for
// that tag is placed there.
const (
	clusterA  = "cluster-a"
	clusterB  = "cluster-b"
	namespace = "ci"
)

var targetNames = map[string]string{clusterA: "ci-a", clusterB: "ci-b"}

// target is one entry of the targets directory.
type target struct {
	name, cluster, tag string
}

// writeTargets adds a target on each cluster the way an operator does:
// `gateway target add` with the cluster's admin kubeconfig creates the
// namespace, service account, Role and binding and a token, writes
// dir/<name>/kubeconfig and target.yaml with the cluster's tag, and checks
// the target. Entries of an earlier run are removed first: their clusters
// are gone.
func (d *demo) writeTargets(ctx context.Context, dir string, clusters []*cluster.Cluster) ([]target, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	d.story.line("")
	d.story.line("A target on each: `gateway target add` gives jetway a namespace with the")
	d.story.line("cluster's admin kubeconfig (a service account, a Role granting what jetway")
	d.story.line("needs, its binding, a token) and writes the entry into %s:", display(dir))
	var out []target
	for _, c := range clusters {
		t := target{name: targetNames[c.Name], cluster: c.Name, tag: c.Name}
		args := []string{"target", "add", t.name, "--kubeconfig", c.AdminKubeconfig(), "--namespace", namespace,
			"--create-namespace", "--tag", t.tag, "--out", dir}
		d.story.command(append([]string{d.gateway(), "target", "add", t.name, "--kubeconfig", "<" + c.Name + " admin>"}, args[5:]...)...)
		// Its progress (stderr) is detail here; the check's row tells.
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, d.gateway(), args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("gateway target add %s: %w\n%s%s", t.name, err, stdout.String(), stderr.String())
		}
		d.story.block(stdout.String())
		out = append(out, t)
	}
	return out, nil
}

// runStepKubelets plays kubelet for the gateway's step pods on every
// cluster (cluster.RunStepPods: each pod's process runs here, in a folder
// of its own, with agent as its step agent). The returned stop ends them
// and returns once they have torn their pods down.
func runStepKubelets(clusters []*cluster.Cluster, agent string, errOut io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range clusters {
		wg.Go(func() {
			if err := c.RunStepPods(ctx, agent); err != nil {
				fmt.Fprintf(errOut, "jetway-demo: %v\n", err)
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}
