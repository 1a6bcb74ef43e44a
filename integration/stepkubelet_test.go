package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// startStepKubelets builds the step agent once and runs the step kubelet
// (cluster.RunStepPods) on every cluster, so that step pods the gateway
// creates run on the kwok nodes. stop ends the kubelets, which kill what
// runs in their pods, and removes the agent binary.
func startStepKubelets(clusters []*cluster.Cluster) (stop func(), err error) {
	agent, cleanup, err := buildStepAgent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range clusters {
		wg.Go(func() {
			if err := c.RunStepPods(ctx, agent); err != nil {
				fmt.Fprintf(os.Stderr, "integration: %v\n", err)
			}
		})
	}
	return func() { cancel(); wg.Wait(); cleanup() }, nil
}

// buildStepAgent builds cmd/step-agent for this machine, into a folder
// cleanup removes.
func buildStepAgent() (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "jetway-step-agent-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "step-agent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/jetway-ci/jetway/cmd/step-agent").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build step-agent: %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}
