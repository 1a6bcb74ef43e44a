package steps

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/targets"
)

// emptyRegistry has no targets: every step waits.
type emptyRegistry struct{ changed chan struct{} }

func (emptyRegistry) Loaded() bool               { return true }
func (emptyRegistry) Snapshot() []targets.Status { return nil }
func (emptyRegistry) Target(string) (*targets.Target, error) {
	return nil, targets.ErrNotFound
}
func (r emptyRegistry) Changed() <-chan struct{} { return r.changed }

func startManager(t *testing.T) *Manager {
	t.Helper()
	m := New(Options{Registry: emptyRegistry{changed: make(chan struct{})}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		_, err := m.Get(Caller{Admin: true}, "", "none")
		return !errors.Is(err, ErrUnavailable)
	}, time.Second, time.Millisecond)
	return m
}

func TestSubmitWaitsAndIsIdempotent(t *testing.T) {
	m := startManager(t)
	team := Caller{Team: "main"}
	req := validRequest()
	v, created, err := m.Submit(team, req)
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, Pending, v.Phase)
	assert.Equal(t, "main", v.Team, "a team token's step is its team's")

	again, created, err := m.Submit(team, req)
	require.NoError(t, err)
	assert.False(t, created, "the same handle returns the existing step")
	assert.Equal(t, v.CreatedAt, again.CreatedAt)

	var waiting Event
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = m.Events(ctx, team, "", req.Handle, 0, func(evs []Event) error {
		waiting = evs[0]
		cancel()
		return nil
	})
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, EventWaiting, waiting.Type)
	assert.Contains(t, waiting.Message, "no target satisfies team 'main'")
}

// A cluster runs every step in a container: a task without an image,
// valid for an agent, is refused here, naming the field.
func TestAClusterStepNeedsAnImage(t *testing.T) {
	m := startManager(t)
	req := validRequest()
	req.Image, req.Platform = "", "darwin"
	_, _, err := m.Submit(Caller{Admin: true}, req)
	var ferr *FieldError
	require.ErrorAs(t, err, &ferr)
	assert.Equal(t, "image", ferr.Field)
}

func TestTeamsDoNotSeeEachOthersSteps(t *testing.T) {
	m := startManager(t)
	_, _, err := m.Submit(Caller{Team: "main"}, validRequest())
	require.NoError(t, err)

	_, err = m.Get(Caller{Team: "other"}, "", "build-1")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = m.Get(Caller{Team: "other"}, "main", "build-1")
	assert.ErrorIs(t, err, ErrNotFound, "naming the team changes nothing")
	_, err = m.Abort(context.Background(), Caller{Team: "other"}, "main", "build-1")
	assert.ErrorIs(t, err, ErrNotFound)
	_, _, err = m.Submit(Caller{Team: "other"}, Request{Handle: "x", Type: "task", Team: "main", Image: "i", Run: Run{Path: "p"}})
	assert.ErrorIs(t, err, ErrForbidden)

	v, err := m.Get(Caller{Admin: true}, "main", "build-1")
	require.NoError(t, err)
	assert.Equal(t, "main", v.Team)
	_, err = m.Get(Caller{Admin: true}, "", "build-1")
	assert.ErrorIs(t, err, ErrNotFound, "an admin names the team")

	// The other team may use the same handle: it is another step.
	_, created, err := m.Submit(Caller{Team: "other"}, validRequest())
	require.NoError(t, err)
	assert.True(t, created)
}

func TestAbortPending(t *testing.T) {
	m := startManager(t)
	_, _, err := m.Submit(Caller{Admin: true}, validRequest())
	require.NoError(t, err)
	v, err := m.Abort(context.Background(), Caller{Admin: true}, "", "build-1")
	require.NoError(t, err)
	assert.Equal(t, Aborted, v.Phase)

	var all []Event
	require.NoError(t, m.Events(context.Background(), Caller{Admin: true}, "", "build-1", 0, func(evs []Event) error {
		all = append(all, evs...)
		return nil
	}), "the events of an ended step end")
	last := all[len(all)-1]
	assert.Equal(t, EventFailed, last.Type)
	assert.Equal(t, Aborted, last.Phase)
	assert.Equal(t, len(all)-1, last.N)

	var since []Event
	require.NoError(t, m.Events(context.Background(), Caller{Admin: true}, "", "build-1", last.N, func(evs []Event) error {
		since = append(since, evs...)
		return nil
	}))
	assert.Equal(t, []Event{last}, since)
}

func TestInputFromAStepMustHaveSucceeded(t *testing.T) {
	m := startManager(t)
	_, _, err := m.Submit(Caller{Admin: true}, validRequest())
	require.NoError(t, err)
	req := validRequest()
	req.Handle = "next"
	req.Inputs = []Input{{Name: "src", From: InputSource{Step: "build-1", Output: "out"}}}
	_, _, err = m.Submit(Caller{Admin: true}, req)
	require.ErrorIs(t, err, ErrInput)
	assert.Contains(t, err.Error(), `inputs[0].from: step "build-1" is pending`)
	req.Inputs[0].From.Step = "nope"
	_, _, err = m.Submit(Caller{Admin: true}, req)
	assert.ErrorContains(t, err, `step "nope" not found`)
}

// unsyncedRegistry has one target whose watch never lists (its cluster
// does not answer).
type unsyncedRegistry struct{ t *targets.Target }

func (unsyncedRegistry) Loaded() bool { return true }
func (r unsyncedRegistry) Snapshot() []targets.Status {
	return []targets.Status{{Name: r.t.Name(), State: targets.StateStalled}}
}
func (r unsyncedRegistry) Target(string) (*targets.Target, error) { return r.t, nil }
func (unsyncedRegistry) Changed() <-chan struct{}                 { return nil }

// TestUnknownStepsWaitForRecovery: until the step pods of every target
// were read, a handle this gateway does not know may be in one of them,
// so it answers "unavailable" (503), never "not found", and takes no new
// step; an unreachable target holds that up for recoverTimeout at most.
func TestUnknownStepsWaitForRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"}}, "jetway")
		require.NoError(t, err)
		m := New(Options{Registry: unsyncedRegistry{tgt}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- m.Start(ctx) }()
		synctest.Wait()
		_, err = m.Get(Caller{Admin: true}, "", "build-1")
		assert.ErrorIs(t, err, ErrUnavailable)
		_, _, err = m.Submit(Caller{Admin: true}, validRequest())
		assert.ErrorIs(t, err, ErrUnavailable)

		time.Sleep(recoverTimeout + 2*time.Second)
		_, err = m.Get(Caller{Admin: true}, "", "build-1")
		assert.ErrorIs(t, err, ErrNotFound)
		_, created, err := m.Submit(Caller{Admin: true}, validRequest())
		require.NoError(t, err)
		assert.True(t, created)
		cancel()
		require.NoError(t, <-done)
	})
}
