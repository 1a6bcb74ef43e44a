package lifecycle

import (
	"slices"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/targets"
	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pod(name string, phase corev1.PodPhase, finished time.Time, deleting bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(finished.Add(-time.Hour))},
		Status: corev1.PodStatus{Phase: phase}}
	if !finished.IsZero() && (phase == corev1.PodSucceeded || phase == corev1.PodFailed) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{FinishedAt: metav1.NewTime(finished)}}}}
	}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return p
}

func TestUnfinishedAndStale(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	pods := []*corev1.Pod{
		pod("running", corev1.PodRunning, now, false),
		pod("pending", corev1.PodPending, now, false),
		pod("done-long-ago", corev1.PodSucceeded, now.Add(-time.Hour), false),
		pod("failed-long-ago", corev1.PodFailed, now.Add(-time.Hour), false),
		pod("done-just-now", corev1.PodSucceeded, now.Add(-time.Second), false),
		pod("done-deleting", corev1.PodSucceeded, now.Add(-time.Hour), true),
	}
	assert.Equal(t, []string{"done-deleting", "pending", "running"}, unfinished(pods, false),
		"a pod being deleted still holds its target")
	check := pod("check-container", corev1.PodRunning, now, false)
	check.Labels = map[string]string{targets.ConcourseContainerLabel: "h1"}
	withCheck := append(slices.Clone(pods), check)
	assert.Equal(t, []string{"check-container", "done-deleting", "pending", "running"}, unfinished(withCheck, false),
		"a web node's container holds its target while the web node has its worker")
	assert.Equal(t, []string{"done-deleting", "pending", "running"}, unfinished(withCheck, true),
		"and not once the web node released it")
	c := New(Options{GCGrace: 10 * time.Minute, Now: func() time.Time { return now }})
	var stale []string
	for _, p := range c.stale(pods) {
		stale = append(stale, p.Name)
	}
	assert.Equal(t, []string{"done-long-ago", "failed-long-ago"}, stale)

	// A pod whose live owner collects it itself is left to it.
	c.opts.Owned = func(p *corev1.Pod) bool { return p.Name == "done-long-ago" }
	stale = nil
	for _, p := range c.stale(pods) {
		stale = append(stale, p.Name)
	}
	assert.Equal(t, []string{"failed-long-ago"}, stale)
}

func TestFinishedAtFallsBack(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
	assert.Equal(t, created, finishedAt(&p), "no statuses: creation time")
	ready := created.Add(time.Minute)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, LastTransitionTime: metav1.NewTime(ready)}}
	assert.Equal(t, ready, finishedAt(&p), "readiness change")
	end := created.Add(2 * time.Minute)
	p.Status.ContainerStatuses = []corev1.ContainerStatus{
		{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: metav1.NewTime(end)}}},
		{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: metav1.NewTime(end.Add(-time.Second))}}},
	}
	assert.Equal(t, end, finishedAt(&p), "last container to end")
}

// TestEndedStepPodsAreCollected: a step pod whose step ended keeps running
// (its outputs stay served); the end jetway recorded on it is its finish.
func TestEndedStepPodsAreCollected(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ended := func(name string, at time.Time) *corev1.Pod {
		p := pod(name, corev1.PodRunning, now, false)
		p.Annotations = map[string]string{targets.StepEndedAnnotation: at.Format(time.RFC3339Nano)}
		return p
	}
	pods := []*corev1.Pod{ended("ended-long-ago", now.Add(-time.Hour)), ended("ended-just-now", now.Add(-time.Second)),
		pod("running", corev1.PodRunning, now, false)}
	assert.Equal(t, []string{"running"}, unfinished(pods, false), "an ended step holds no target")
	c := New(Options{GCGrace: 10 * time.Minute, Now: func() time.Time { return now }})
	var stale []string
	for _, p := range c.stale(pods) {
		stale = append(stale, p.Name)
	}
	assert.Equal(t, []string{"ended-long-ago"}, stale)
}

func TestRecordRoundTrips(t *testing.T) {
	life := targets.Lifecycle{State: targets.StateRetired, Since: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC),
		ConfigHash: "abc", PrunedHash: "def"}
	assert.Equal(t, map[string]string{"state": "retired", "since": "2026-11-22T12:00:00Z",
		"config-sha256": "abc", "pruned-config-sha256": "def"}, life.Data(), "the record's keys, as other replicas read them")
	assert.Equal(t, life, targets.DecodeLifecycle(life.Data()))
	assert.Empty(t, targets.Lifecycle{}.Data())
}
