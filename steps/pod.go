package steps

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// HandleLabel holds a step pod's handle (unique within its team),
// beside the ownership labels, its team and its owner.
const HandleLabel = "jetway-ci.dev/step"

// agentCommand is how the gateway runs the agent in the step container:
// relative to its working directory, the root, so that the same command
// works in a pod (root /jetway) and on a kwok node, where exec runs a
// local process in a folder standing in for the pod's emptyDir.
const agentCommand = stepagent.BinPath

// buildPod is the pod of step sum placed on target t, owned by owner.
func buildPod(sum *Summary, owner string, t *targets.Target, placed Placed, opts steppod.Options) *corev1.Pod {
	return steppod.Build(t, steppod.Spec{Name: placed.Pod, Type: sum.Type, Team: sum.Team, Image: sum.Image,
		Labels:    map[string]string{HandleLabel: sum.Handle, ownership.OwnerLabel: owner},
		Resources: sum.Resources, Privileged: sum.Privileged}, opts)
}

// awaitKey waits until the pod key is read, if it is being read: a pod is
// made, or taken over, only sealed.
func awaitKey(ctx context.Context, k ownership.Key) error {
	if k.Ready() == nil {
		return nil
	}
	select {
	case <-k.Ready():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
