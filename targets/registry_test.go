package targets

import (
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
			rec := &record{name: "a", cfg: &Config{}}
			for _, h := range tt.checks {
				rec.record(h, 3)
			}
			assert.Equal(t, tt.healthy, rec.healthy)
			want := StateStalled
			if tt.healthy {
				want = StateRunning
			}
			assert.Equal(t, want, rec.status().State)
		})
	}
}

func TestStatusReasons(t *testing.T) {
	rec := &record{name: "a", cfg: &Config{Meta: Metadata{Team: "main"}}}
	assert.Equal(t, "not checked yet", rec.status().Error)

	rec.record(Health{Missing: []Permission{{Resource: "pods", Subresource: "portforward", Verb: "create"}}, Reason: ReasonPermissions}, 1)
	s := rec.status()
	assert.Equal(t, StateStalled, s.State)
	assert.Equal(t, []string{"create pods/portforward"}, s.MissingPermissions)
	assert.Equal(t, "missing permissions: create pods/portforward", s.Error)

	rec.record(Health{}, 1)
	rec.entryErr = fmt.Errorf("%w: kubeconfig does not parse", ErrInvalidEntry)
	s = rec.status()
	assert.Equal(t, StateStalled, s.State, "an invalid entry never runs, even on its last good config")
	assert.Equal(t, "main", s.Meta.Team, "last good configuration kept")
	assert.Contains(t, s.Error, "does not parse")
}

func TestApplyKeepsLastGoodAndForgetsRemoved(t *testing.T) {
	r := NewRegistry(RegistryOptions{Interval: time.Hour, Timeout: time.Millisecond, StallAfter: 1, Concurrency: 1})
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
	cfg, err := r.Config("a")
	require.NoError(t, err)
	assert.Same(t, a, cfg, "last good configuration kept")

	_, err = r.Get("b")
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestLifecycleStatesAndPrune(t *testing.T) {
	r := NewRegistry(RegistryOptions{Interval: time.Hour, Timeout: time.Millisecond, StallAfter: 1, Concurrency: 1})
	cfg := &Config{Name: "a", hash: "h1"}
	r.records["a"] = &record{name: "a", cfg: cfg, checked: true, healthy: true}

	s, err := r.Get("a")
	require.NoError(t, err)
	assert.Equal(t, StateRunning, s.State)
	assert.ErrorIs(t, r.Prune("a"), ErrRunning, "a running target cannot be pruned")

	for _, st := range []State{StateLanding, StateLanded, StateRetiring} {
		r.SetLifecycle("a", cfg, Lifecycle{State: st, Holding: []string{"p"}})
		s, _ := r.Get("a")
		assert.Equal(t, st, s.State)
	}
	r.records["a"].healthy = false
	s, _ = r.Get("a")
	assert.Equal(t, StateRetiring, s.State, "only running targets stall")

	r.SetLifecycle("a", &Config{Name: "a"}, Lifecycle{State: StateLanded})
	s, _ = r.Get("a")
	assert.Equal(t, StateRetiring, s.State, "results for a replaced config are dropped")

	r.SetLifecycle("a", cfg, Lifecycle{State: StateRetired, ConfigHash: "h1"})
	_, err = r.Get("a")
	assert.ErrorIs(t, err, ErrNotFound, "retired with this config: forgotten")
	assert.Empty(t, r.Snapshot())
	r.SetLifecycle("a", cfg, Lifecycle{State: StateRetired, ConfigHash: "older"})
	_, err = r.Get("a")
	assert.NoError(t, err, "retired with another config: back as new")

	r.SetLifecycle("a", cfg, Lifecycle{})
	require.NoError(t, r.Prune("a"))
	_, err = r.Get("a")
	assert.ErrorIs(t, err, ErrNotFound)
	r.observe("a", cfg, Health{})
	_, err = r.Get("a")
	assert.NoError(t, err, "back once a check succeeds")
}
