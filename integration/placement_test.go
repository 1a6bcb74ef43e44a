package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/api"
)

// counts is what jetway's target list says of a target's step pods.
type counts struct{ containers, build, tasks, volumes int }

func (g *gateway) counts(t *testing.T, name string) counts {
	t.Helper()
	tg, ok := g.targetsByName(t)[name]
	require.True(t, ok, "target %s listed", name)
	return counts{tg.ActiveContainers, tg.BuildContainers, tg.ActiveTasks, tg.ActiveVolumes}
}

// workerCounts is what fly workers reads of them (no build containers).
func (g *gateway) workerCounts(t *testing.T, name string) counts {
	t.Helper()
	var workers []api.Worker
	g.get(t, "/api/v1/workers", &workers)
	for _, w := range workers {
		if w.Name == name {
			return counts{containers: w.ActiveContainers, tasks: w.ActiveTasks, volumes: w.ActiveVolumes}
		}
	}
	t.Fatalf("worker %s not listed", name)
	return counts{}
}

// waitCounts waits until the target list and fly's worker list both show
// want, failing on any negative count seen on the way.
func (g *gateway) waitCounts(t *testing.T, name string, want counts, within time.Duration) {
	t.Helper()
	var last, lastWorker counts
	wantWorker := want
	wantWorker.build = 0
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		last, lastWorker = g.counts(t, name), g.workerCounts(t, name)
		for _, c := range []counts{last, lastWorker} {
			require.True(t, c.containers >= 0 && c.build >= 0 && c.tasks >= 0 && c.volumes >= 0, "negative count %+v", c)
		}
		if last == want && lastWorker == wantWorker {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("counts of %s: want %+v, still %+v (workers %+v) after %s", name, want, last, lastWorker, within)
}

// TestCountsFollowStepPodsThroughARestart moves a target's counts with
// its step pods, then restarts its API server and changes the pods as soon
// as it is back: the watch resumes (or relists) and the counts follow.
func TestCountsFollowStepPodsThroughARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	_, dir := lifecycleTarget(ctx, t, c, "counts")
	g := startTargetsGateway(t, dir)
	g.waitTarget(t, "counts", 10*time.Second, running)
	g.waitCounts(t, "counts", counts{}, 5*time.Second)

	for name, typ := range map[string]string{"task-1": "task", "task-2": "task", "get-1": "get", "check-1": "check"} {
		typedStepPod(ctx, t, c, "counts", "counts", "jetway", name, typ)
	}
	g.waitCounts(t, "counts", counts{containers: 4, build: 3, tasks: 2, volumes: 4}, 5*time.Second)
	finish(ctx, t, c, "counts", "task-1", time.Now())
	g.waitCounts(t, "counts", counts{containers: 3, build: 2, tasks: 1, volumes: 4}, 5*time.Second)

	c.StopAPIServer()
	require.NoError(t, c.StartAPIServer(ctx))
	zero := int64(0)
	require.NoError(t, c.Client.CoreV1().Pods("counts").Delete(ctx, "check-1", metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	finish(ctx, t, c, "counts", "get-1", time.Now())
	typedStepPod(ctx, t, c, "counts", "counts", "jetway", "put-1", "put")
	g.waitCounts(t, "counts", counts{containers: 2, build: 2, tasks: 1, volumes: 4}, 20*time.Second)
	g.waitTarget(t, "counts", 20*time.Second, running)
}
