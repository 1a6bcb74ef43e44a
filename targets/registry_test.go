package targets

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAntiFlap(t *testing.T) {
	ok := Health{}
	bad := Health{Err: errors.New("down"), Reason: ReasonUnreachable}
	tests := []struct {
		name    string
		checks  []Health
		healthy bool
	}{
		{"never checked", nil, false},
		{"one success runs", []Health{ok}, true},
		{"one failure does not stall", []Health{ok, bad}, true},
		{"two failures do not stall", []Health{ok, bad, bad}, true},
		{"three failures stall", []Health{ok, bad, bad, bad}, false},
		{"a success in between resets", []Health{ok, bad, bad, ok, bad, bad}, true},
		{"one success brings it back", []Health{ok, bad, bad, bad, ok}, true},
		{"failing from the start stays stalled", []Health{bad}, false},
		{"missing permission counts as failure", []Health{ok, {Missing: Required[:1]}, {Missing: Required[:1]}, {Missing: Required[:1]}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRegistry(RegistryOptions{})
			rec := &record{name: "a", cfg: &Config{}}
			for _, h := range tt.checks {
				rec.record(h, 3)
			}
			assert.Equal(t, tt.healthy, rec.healthy)
			want := StateStalled
			if tt.healthy {
				want = StateRunning
			}
			assert.Equal(t, want, r.status(rec).State)
		})
	}
}

func TestStatusReasons(t *testing.T) {
	r := NewRegistry(RegistryOptions{})
	rec := &record{name: "a", cfg: &Config{Meta: Metadata{Team: "main"}}}
	assert.Equal(t, "not checked yet", r.status(rec).Error)

	rec.record(Health{Missing: []Permission{{Resource: "pods", Subresource: "portforward", Verb: "create"}}, Reason: ReasonPermissions}, 1)
	s := r.status(rec)
	assert.Equal(t, StateStalled, s.State)
	assert.Equal(t, []string{"create pods/portforward"}, s.MissingPermissions)
	assert.Equal(t, "missing permissions: create pods/portforward", s.Error)

	rec.record(Health{}, 1)
	rec.entryErr = fmt.Errorf("%w: kubeconfig does not parse", ErrInvalidEntry)
	s = r.status(rec)
	assert.Equal(t, StateStalled, s.State, "an invalid entry never runs, even on its last good config")
	assert.Equal(t, "main", s.Meta.Team, "last good configuration kept")
	assert.Contains(t, s.Error, "does not parse")
}

func TestApplyKeepsLastGoodAndForgetsRemoved(t *testing.T) {
	r := NewRegistry(RegistryOptions{Interval: time.Hour, Timeout: time.Millisecond, StallAfter: 1, Concurrency: 1})
	r.watch = emptyWatch
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Start(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	good := func(name string) *Config {
		c, err := parse(entry{name: name, kubeconfig: []byte(kubeconfig("    server: https://127.0.0.1:1\n", "", ""))}, t.TempDir(), Policy{})
		require.NoError(t, err)
		return c
	}
	a, b := good("a"), good("b")
	assert.False(t, r.Loaded())
	r.Apply(map[string]Result{"a": {Config: a}, "b": {Config: b}})
	assert.True(t, r.Loaded())
	require.Len(t, r.Snapshot(), 2)

	r.Apply(map[string]Result{"a": {Err: fmt.Errorf("%w: broken", ErrInvalidEntry)}})
	snap := r.Snapshot()
	require.Len(t, snap, 1, "b removed")
	assert.Equal(t, "a", snap[0].Name)
	assert.Contains(t, snap[0].Error, "broken")
	tg, err := r.Target("a")
	require.NoError(t, err)
	assert.Same(t, a, tg.Config, "last good configuration kept")

	_, err = r.Get("b")
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestLifecycleStatesAndPrune(t *testing.T) {
	r := NewRegistry(RegistryOptions{Interval: time.Hour, Timeout: time.Millisecond, StallAfter: 1, Concurrency: 1})
	cfg := testConfig(t, "a")
	tg := listed(cfg, Lifecycle{}, stepPod("p", "task", corev1.PodRunning))
	r.records["a"] = &record{name: "a", cfg: cfg, checked: true, healthy: true, target: tg}

	s, err := r.Get("a")
	require.NoError(t, err)
	assert.Equal(t, StateRunning, s.State)
	assert.Empty(t, s.Holding, "a running target holds nothing")
	assert.ErrorIs(t, r.Prune("a"), ErrRunning, "a running target cannot be pruned")

	for _, st := range []State{StateLanding, StateLanded, StateRetiring} {
		setRecord(tg, Lifecycle{State: st})
		s, _ := r.Get("a")
		assert.Equal(t, st, s.State)
		if st != StateLanded {
			assert.Equal(t, []string{"p"}, s.Holding, "%s waits for its unfinished step pods", st)
		}
	}
	r.records["a"].healthy = false
	s, _ = r.Get("a")
	assert.Equal(t, StateRetiring, s.State, "only running targets stall")

	setRecord(tg, Lifecycle{State: StateRetired, ConfigHash: cfg.hash})
	_, err = r.Get("a")
	assert.ErrorIs(t, err, ErrNotFound, "retired with this config: forgotten")
	assert.Empty(t, r.Snapshot())
	setRecord(tg, Lifecycle{State: StateRetired, ConfigHash: "older"})
	_, err = r.Get("a")
	assert.NoError(t, err, "retired with another config: back as new")

	setRecord(tg, Lifecycle{})
	require.NoError(t, r.Prune("a"))
	_, err = r.Get("a")
	assert.ErrorIs(t, err, ErrNotFound)
	r.observe("a", cfg, Health{})
	_, err = r.Get("a")
	assert.NoError(t, err, "back once a check succeeds")
}

func TestUnlistedCacheKeepsTargetFromWork(t *testing.T) {
	r := NewRegistry(RegistryOptions{Interval: time.Hour, Timeout: time.Millisecond, StallAfter: 1, Concurrency: 1})
	cfg := testConfig(t, "a")
	tg, err := NewTarget(cfg, "test")
	require.NoError(t, err)
	r.records["a"] = &record{name: "a", cfg: cfg, checked: true, healthy: true, target: tg}
	tg.pods.Failed(errors.New(`pods is forbidden: cannot watch`))
	s, _ := r.Get("a")
	assert.Equal(t, StateStalled, s.State, "its lifecycle is unknown until the watch lists")
	assert.Contains(t, s.Error, "pods is forbidden: cannot watch")

	_ = tg.pods.Replace(nil, "1")
	setRecord(tg, Lifecycle{})
	s, _ = r.Get("a")
	assert.Equal(t, StateRunning, s.State)
}

func TestCountsFollowStepPods(t *testing.T) {
	deleting := stepPod("d", "task", corev1.PodRunning)
	deleting.DeletionTimestamp = &metav1.Time{}
	tg := listed(testConfig(t, "a"), Lifecycle{},
		stepPod("t1", "task", corev1.PodRunning), stepPod("t2", "task", corev1.PodPending),
		stepPod("g", "get", corev1.PodRunning), stepPod("c", "check", corev1.PodRunning),
		stepPod("done", "put", corev1.PodSucceeded), stepPod("failed", "task", corev1.PodFailed),
		stepPod("nolabel", "", corev1.PodRunning), deleting)
	assert.Equal(t, Counts{ActiveContainers: 6, BuildContainers: 4, ActiveTasks: 3, ActiveVolumes: 7}, tg.Counts(),
		"containers: unfinished pods; build: task, get, put; volumes: emptyDirs of pods not being deleted")
	assert.Equal(t, []string{"c", "d", "g", "nolabel", "t1", "t2"}, tg.Holding())

	_ = tg.pods.Delete(deleting)
	_ = tg.pods.Update(stepPod("t1", "task", corev1.PodSucceeded))
	assert.Equal(t, Counts{ActiveContainers: 4, BuildContainers: 2, ActiveTasks: 1, ActiveVolumes: 7}, tg.Counts())
	_ = tg.pods.Replace(nil, "2") // a relist after a restart finds them gone
	assert.Equal(t, Counts{}, tg.Counts())
}

// stepPod is a step pod of type typ (none when "") in phase, with one
// emptyDir volume.
func stepPod(name, typ string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "a", Labels: map[string]string{}},
		Spec:   corev1.PodSpec{Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		Status: corev1.PodStatus{Phase: phase}}
	if typ != "" {
		p.Labels[StepTypeLabel] = typ
	}
	return p
}

func TestForeignRecordReadsAsNoneAndSaysWhy(t *testing.T) {
	r := NewRegistry(RegistryOptions{})
	cfg := testConfig(t, "a")
	tg := listed(cfg, Lifecycle{})
	_ = tg.record.Replace([]any{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: tg.RecordName, Namespace: "a"},
		Data: Lifecycle{State: StateLanded}.Data()}}, "2")
	r.records["a"] = &record{name: "a", cfg: cfg, checked: true, healthy: true, target: tg}
	s, _ := r.Get("a")
	assert.Equal(t, StateRunning, s.State, "an unlabelled ConfigMap decides nothing")
	assert.Equal(t, "lifecycle: configmap a/jetway-test-a exists without this installation's ownership labels; jetway leaves it alone", s.Error)
}
