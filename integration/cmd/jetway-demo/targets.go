package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
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

// writeTargets makes each cluster's namespace ready for jetway (a service
// account, a Role granting targets.Required, its binding and a token) and
// writes the target entry: dir/<name>/kubeconfig and target.yaml with the
// cluster's tag. Entries of an earlier run are removed first: their
// clusters are gone. This is what `gateway target add NAME --kubeconfig
// ADMIN --namespace ci --tag TAG --out dir` will do for each cluster.
func writeTargets(ctx context.Context, dir string, clusters []*cluster.Cluster) ([]target, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	var out []target
	for _, c := range clusters {
		t := target{name: targetNames[c.Name], cluster: c.Name, tag: c.Name}
		made, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: namespace, Rules: targets.RBACRules(targets.Required)})
		if err != nil {
			return nil, fmt.Errorf("target %s: %w", t.name, err)
		}
		entry := filepath.Join(dir, t.name)
		if err := os.MkdirAll(entry, 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(entry, "kubeconfig"), made.Kubeconfig, 0o600); err != nil {
			return nil, err
		}
		meta := fmt.Sprintf("tags: [%s]\n", t.tag)
		if err := os.WriteFile(filepath.Join(entry, "target.yaml"), []byte(meta), 0o600); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func (d *demo) printTargets(dir string, tgts []target) {
	d.story.line("")
	d.story.line("A target on each, in %s: namespace %s, a service account whose Role", display(dir), namespace)
	d.story.line("grants what jetway needs, its token in a kubeconfig, and a tag:")
	for _, t := range tgts {
		d.story.line("  %-5s on %s, tags: [%s]  (%s/{kubeconfig,target.yaml})", t.name, t.cluster, t.tag,
			display(filepath.Join(dir, t.name)))
	}
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
