package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// TestRealNodeAgentImageVolume: on the real node (containerd 2.x, which
// mounts image volumes) a step pod made with the agent's image as an image
// volume has no init container; the agent is the step container's pid 1,
// from the read-only volume, the step's image unchanged; an input is
// there before the process, and its output goes out.
func TestRealNodeAgentImageVolume(t *testing.T) {
	testAgentMount(t, "rn-agent-volume", steppod.AgentImageVolume)
}

// TestRealNodeAgentInitContainer: the fallback for runtimes without image
// volumes, on the same node: the init container copies the agent into the
// pod, with the same guarantees.
func TestRealNodeAgentInitContainer(t *testing.T) {
	testAgentMount(t, "rn-agent-init", steppod.AgentInitContainer)
}

// TestRealNodeAgentAuto: with step-agent-mount auto, a target that may
// list the real node (kubelet 1.36, containerd 2.x) gets the image
// volume, with its guarantees.
func TestRealNodeAgentAuto(t *testing.T) {
	testAgentMount(t, "rn-agent-auto", steppod.AgentAuto)
}

func testAgentMount(t *testing.T, target string, mount steppod.AgentMount) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	node, err := rn.Client.CoreV1().Nodes().Get(ctx, rn.NodeName(), metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://2."),
		"the node runs containerd 2.x: %s", node.Status.NodeInfo.ContainerRuntimeVersion)
	if mount == steppod.AgentAuto {
		grantListNodes(ctx, t, rn, "jetway-test-list-nodes-"+target, target)
	}
	g := nodeGateway(ctx, t, target, gatewayOptions{agentMount: mount})
	if mount == steppod.AgentAuto {
		tg, err := g.registry.Target(target)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return g.chooser.AgentMount(tg) == steppod.AgentImageVolume },
			20*time.Second, 50*time.Millisecond, "auto chooses the image volume on the real node")
		mount = steppod.AgentImageVolume
	}
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)

	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "greeting"), []byte("hello"), 0o644))
	req := nodeStep("agent", `tr '\0' ' ' </proc/1/cmdline; echo; cat in/greeting; echo;
if touch /tmp/jetway/bin/probe 2>/dev/null; then echo agent-writable; else echo agent-read-only; fi
cat in/greeting >out/copy`)
	req.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Upload: true}}}
	req.Outputs = []wire.Output{{Name: "out"}}
	_, _, err = c.SubmitStep(ctx, req)
	require.NoError(t, err)
	_, err = c.UploadInput(ctx, "", "agent", "in", src)
	require.NoError(t, err)
	evs := g.stepEvents(ctx, t, "agent", "", 0)
	require.Equal(t, []string{"placed", "scheduled", "input", "started", "exited"}, types(evs), "%+v", evs)
	lines := strings.Split(outputOf(evs, wire.EventStdout), "\n")
	require.GreaterOrEqual(t, len(lines), 3, outputOf(evs, wire.EventStderr))
	assert.Equal(t, "/tmp/jetway/bin/step-agent pid1 ", lines[0], "the agent is the step container's pid 1")
	assert.Equal(t, "hello", lines[1], "the input is there before the process")
	if mount == steppod.AgentImageVolume {
		assert.Equal(t, "agent-read-only", lines[2], "the step cannot change the agent the next exec runs")
	} else {
		// The copy is the pod's, in a folder the init container made as
		// 65532: a step running as root writes there.
		assert.Equal(t, "agent-writable", lines[2])
	}
	dst := t.TempDir()
	_, err = c.DownloadOutput(ctx, "", "agent", "out", dst)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dst, "copy"))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))

	p, err := rn.Client.CoreV1().Pods(target).Get(ctx, g.step(t, "agent").Pod, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "jetway.test/busybox:1", p.Spec.Containers[0].Image, "the step's image as it is")
	switch mount {
	case steppod.AgentImageVolume:
		assert.Empty(t, p.Spec.InitContainers)
		require.Len(t, p.Spec.Volumes, 2)
		require.NotNil(t, p.Spec.Volumes[1].Image)
		assert.Equal(t, rn.NodeImage("step-agent-image.tar"), p.Spec.Volumes[1].Image.Reference)
	case steppod.AgentInitContainer:
		require.Len(t, p.Spec.InitContainers, 1)
		require.Len(t, p.Status.InitContainerStatuses, 1)
		require.NotNil(t, p.Status.InitContainerStatuses[0].State.Terminated)
		assert.Zero(t, p.Status.InitContainerStatuses[0].State.Terminated.ExitCode)
		assert.Len(t, p.Spec.Volumes, 1)
	}
}
