package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// TestAPendingStepSurvivesARestart: a step no target fits waits in its
// record, not in the gateway: the only gateway is killed and started
// again, and once a target that fits appears the step runs, once, with
// the events it had before the restart numbered as they were.
func TestAPendingStepSurvivesARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "pend-plain", "{}\n", "")
	state := newState(t)
	api := freeAddr(t)
	args := append([]string{"run", "--listen", api, "--targets-dir", dir, "--no-auth", "--health-interval", "1s",
		"--step-agent-image", "ghcr.io/jetway-ci/step-agent:test"}, state.flags(t)...)
	p := startGatewayProcess(t, args...)
	c, err := client.New(client.Options{URL: "http://" + api, Retry: 50 * time.Millisecond})
	require.NoError(t, err)
	// Running once its pods are listed: until then the placer would name it
	// stalled, not missing the tag.
	workerRunning(ctx, t, c, "pend-plain")

	marker := filepath.Join(t.TempDir(), "ran")
	req := shStep("pend", `echo ran >> "$M"; echo done`)
	req.Tags, req.Run.Env = []string{"gpu"}, map[string]string{"M": marker}
	_, created, err := c.SubmitStep(ctx, req)
	require.NoError(t, err)
	require.True(t, created)
	var before wire.View
	eventually(t, 10*time.Second, func() error {
		if before, err = c.Step(ctx, "", "pend"); err != nil || before.Waiting == "" {
			return errorf("not waiting yet: %+v, %v", before, err)
		}
		return nil
	})
	assert.Equal(t, wire.Pending, before.Phase)
	assert.Equal(t, "no target satisfies tags 'gpu': pend-plain: missing tags gpu", before.Waiting)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.wait(t, 10*time.Second)
	startGatewayProcess(t, args...)
	after, err := c.Step(ctx, "", "pend")
	require.NoError(t, retrying(ctx, func() (err error) { after, err = c.Step(ctx, "", "pend"); return err }))
	assert.Equal(t, wire.Pending, after.Phase, "still waiting, after its gateway died")
	assert.Equal(t, before.CreatedAt, after.CreatedAt)

	placeTarget(ctx, t, clusters[0], dir, "pend-gpu", "tags: [gpu]\n", "")
	var evs []wire.Event
	require.NoError(t, c.Follow(ctx, "", "pend", 0, func(e wire.Event) error { evs = append(evs, e); return nil }))
	// The new placer may say once more why the step waits (pend-gpu is
	// stalled until its pods are listed) before it places it.
	kinds := types(evs)
	require.GreaterOrEqual(t, len(kinds), 5)
	placed := len(kinds) - 4
	assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, kinds[placed:])
	for _, k := range kinds[:placed] {
		assert.Equal(t, "waiting", k)
	}
	assert.Equal(t, before.Waiting, evs[0].Message, "the waiting event from before the restart, event 0 still")
	assert.Equal(t, "pend-gpu", evs[placed].Target)
	assert.Equal(t, "done\n", outputOf(evs, wire.EventStdout))
	ran, err := os.ReadFile(marker)
	require.NoError(t, err)
	assert.Equal(t, "ran\n", string(ran))
}

// TestRotationThenPodDeleted: a running step's target gets a new
// kubeconfig; its pod is then deleted by hand: the step ends within 10 s,
// saying so, from the rotated target's watch.
func TestRotationThenPodDeleted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	dir := t.TempDir()
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "rot-step", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	writeFile(t, filepath.Join(dir, "rot-step.kubeconfig"), tg.Kubeconfig)
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "rot-step", 10*time.Second, running)
	g.run(t, shStep("rotated", `echo up; exec sleep 600`))
	v := g.waitPhase(t, "rotated", wire.Running)
	before, err := g.registry.Target("rot-step")
	require.NoError(t, err)

	rotate(ctx, t, c, tg, dir)
	eventually(t, 20*time.Second, func() error {
		now, err := g.registry.Target("rot-step")
		if err != nil || now == before {
			return errorf("not rotated yet")
		}
		if ok, _ := now.Synced(); !ok {
			return errorf("the new watch has not listed yet")
		}
		return nil
	})
	require.NoError(t, c.Client.CoreV1().Pods("rot-step").Delete(ctx, v.Pod, metav1.DeleteOptions{}))
	last := g.endsWithin(ctx, t, "rotated", time.Now())
	assert.Equal(t, "PodDeleted", last.Reason)
	assert.Equal(t, "the step's pod was deleted by someone else", last.Message)
}

// TestARemovedTargetEndsItsSteps: a running step's target leaves the
// targets directory: the step ends, errored, naming it, once the grace
// passed; nothing about it goes on retrying.
func TestARemovedTargetEndsItsSteps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "removed", "{}\n", "")
	placeTarget(ctx, t, clusters[0], dir, "stays", "tags: [other]\n", "")
	g := startGateway(t, dir, gatewayOptions{targetGone: 2 * time.Second})
	g.waitTarget(t, "removed", 10*time.Second, running)
	g.run(t, shStep("orphan", `exec sleep 600`))
	g.waitPhase(t, "orphan", wire.Running)
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "removed")))
	removed := time.Now()
	evs := g.stepEvents(ctx, t, "orphan", "", 0)
	last := evs[len(evs)-1]
	assert.Equal(t, "TargetRemoved", last.Reason)
	assert.Contains(t, last.Message, "target removed: target removed left the targets directory while the step ran")
	v := g.step(t, "orphan")
	assert.Less(t, v.FinishedAt.Sub(removed), 10*time.Second, "within the grace and a margin")
	assert.True(t, v.Released, "nothing left to do for it")
	code, _, _ := call(t, http.MethodGet, g.base+"/api/v1/steps/orphan", "")
	assert.Equal(t, http.StatusOK, code)
}

// TestOwnersCollectTheirPods: an ended step's kept pod goes gc-grace after
// its end, deleted by the step's owner (the lifecycle's collection leaves
// a live owner's pods to it), and the step shows released.
func TestOwnersCollectTheirPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[0], "gc-owned", "{}\n", gatewayOptions{gcGrace: 2 * time.Second})
	req := shStep("collected", "echo done")
	req.Outputs = []wire.Output{{Name: "out"}}
	g.run(t, req)
	evs := g.stepEvents(ctx, t, "collected", "", 0)
	require.Equal(t, wire.EventExited, evs[len(evs)-1].Type)
	v := g.step(t, "collected")
	require.False(t, v.Released, "kept for its outputs")
	eventually(t, 20*time.Second, func() error {
		if v = g.step(t, "collected"); !v.Released {
			return errorf("not released yet")
		}
		return nil
	})
	_, err := clusters[0].Client.CoreV1().Pods("gc-owned").Get(ctx, v.Pod, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "its pod is gone: %v", err)
	assert.Equal(t, float64(1), metricValue(t, g, "jetway_step_owned_pods_deleted_total"), "by its owner")
	assert.Zero(t, metricValue(t, g, `jetway_step_pods_deleted_total{reason="gc"}`), "not by the lifecycle's collection")
}

// workerRunning waits until the gateway c lists name running.
func workerRunning(ctx context.Context, t *testing.T, c *client.Client, name string) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		ws, err := c.Workers(ctx)
		if err != nil {
			return err
		}
		for _, w := range ws {
			if w.Name == name && w.State == "running" {
				return nil
			}
		}
		return errorf("%s not running yet: %+v", name, ws)
	})
}
