package steps_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steppod"
	. "github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/steps/stepstest"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// firstEvents follows a step's events until n came, or fails.
func firstEvents(t *testing.T, m *Manager, caller Caller, team, handle string, n int) []wire.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []wire.Event
	err := m.Events(ctx, caller, team, handle, 0, func(evs []wire.Event) error {
		got = append(got, evs...)
		if len(got) >= n {
			cancel()
		}
		return nil
	})
	if err != nil {
		require.ErrorIs(t, err, context.Canceled, "got %d of %d events: %+v", len(got), n, got)
	}
	require.GreaterOrEqual(t, len(got), n)
	return got
}

func TestSubmitWaitsAndIsIdempotent(t *testing.T) {
	m := stepstest.Start(t, Options{})
	team := Caller{Team: "main"}
	req := validRequest()
	req.Run.Env = map[string]string{"TOKEN": "s3cret"}
	v, created, err := m.Submit(team, req)
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, wire.Pending, v.Phase)
	assert.Equal(t, "main", v.Team, "a team token's step is its team's")

	again, created, err := m.Submit(team, req)
	require.NoError(t, err)
	assert.False(t, created, "the same handle returns the existing step")
	assert.Equal(t, v.CreatedAt, again.CreatedAt)

	waiting := firstEvents(t, m.Manager, team, "", req.Handle, 1)[0]
	assert.Equal(t, wire.EventWaiting, waiting.Type)
	assert.Equal(t, wire.ReasonNoTargetFits, waiting.Reason)
	assert.Equal(t, "no target satisfies team 'main': there are no targets", waiting.Message)

	name := RecordName("jetway", "main", req.Handle)
	assert.Equal(t, "s3cret", m.Records.DecodedRequest(t, name).Run.Env["TOKEN"], "the record keeps the request whole")
	r, _ := m.Records.Get(name)
	assert.NotContains(t, fmt.Sprintf("%+v", r), "s3cret", "never in what every gateway reads")
}

// A cluster runs every step in a container: a task without an image,
// valid for an agent, is refused here, naming the field.
func TestAClusterStepNeedsAnImage(t *testing.T) {
	m := stepstest.Start(t, Options{})
	req := validRequest()
	req.Image, req.Platform = "", "darwin"
	_, _, err := m.Submit(Caller{Admin: true}, req)
	var ferr *wire.FieldError
	require.ErrorAs(t, err, &ferr)
	assert.Equal(t, "image", ferr.Field)
}

func TestTeamsDoNotSeeEachOthersSteps(t *testing.T) {
	m := stepstest.Start(t, Options{})
	_, _, err := m.Submit(Caller{Team: "main"}, validRequest())
	require.NoError(t, err)

	_, err = m.Get(Caller{Team: "other"}, "", "build-1")
	assert.ErrorIs(t, err, wire.ErrNotFound)
	_, err = m.Get(Caller{Team: "other"}, "main", "build-1")
	assert.ErrorIs(t, err, wire.ErrNotFound, "naming the team changes nothing")
	_, err = m.Abort(context.Background(), Caller{Team: "other"}, "main", "build-1")
	assert.ErrorIs(t, err, wire.ErrNotFound)
	_, _, err = m.Submit(Caller{Team: "other"}, wire.Request{Handle: "x", Type: "task", Team: "main", Image: "i", Run: wire.Run{Path: "p"}})
	assert.ErrorIs(t, err, wire.ErrForbidden)

	v, err := m.Get(Caller{Admin: true}, "main", "build-1")
	require.NoError(t, err)
	assert.Equal(t, "main", v.Team)
	_, err = m.Get(Caller{Admin: true}, "", "build-1")
	assert.ErrorIs(t, err, wire.ErrNotFound, "an admin names the team")

	// The other team may use the same handle: it is another step.
	_, created, err := m.Submit(Caller{Team: "other"}, validRequest())
	require.NoError(t, err)
	assert.True(t, created)
}

func TestAbortPending(t *testing.T) {
	m := stepstest.Start(t, Options{})
	_, _, err := m.Submit(Caller{Admin: true}, validRequest())
	require.NoError(t, err)
	v, err := m.Abort(context.Background(), Caller{Admin: true}, "", "build-1")
	require.NoError(t, err)
	assert.Equal(t, wire.Aborted, v.Phase)
	assert.True(t, v.FinishedAt.After(v.CreatedAt) || v.FinishedAt.Equal(v.CreatedAt))

	var all []wire.Event
	require.NoError(t, m.Events(context.Background(), Caller{Admin: true}, "", "build-1", 0, func(evs []wire.Event) error {
		all = append(all, evs...)
		return nil
	}), "the events of an ended step end")
	last := all[len(all)-1]
	assert.Equal(t, wire.EventFailed, last.Type)
	assert.Equal(t, wire.Aborted, last.Phase)
	for i, e := range all {
		assert.Equal(t, i, e.N, "numbered from 0, no gaps")
	}

	var since []wire.Event
	require.NoError(t, m.Events(context.Background(), Caller{Admin: true}, "", "build-1", last.N, func(evs []wire.Event) error {
		since = append(since, evs...)
		return nil
	}))
	assert.Equal(t, []wire.Event{last}, since)
}

func TestInputFromAStepMustHaveSucceeded(t *testing.T) {
	m := stepstest.Start(t, Options{})
	_, _, err := m.Submit(Caller{Admin: true}, validRequest())
	require.NoError(t, err)
	req := validRequest()
	req.Handle = "next"
	req.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Step: "build-1", Output: "out"}}}
	_, _, err = m.Submit(Caller{Admin: true}, req)
	require.ErrorIs(t, err, wire.ErrInput)
	assert.Contains(t, err.Error(), `inputs[0].from: step "build-1" is pending`)
	req.Inputs[0].From.Step = "nope"
	_, _, err = m.Submit(Caller{Admin: true}, req)
	assert.ErrorContains(t, err, `step "nope" not found`)
}

// TestNoStepBeforeTheRecordsAreRead: until its records were listed, a
// handle this gateway does not know may be a step of another gateway, so
// it answers "unavailable" (503), never "not found", and takes no step.
func TestNoStepBeforeTheRecordsAreRead(t *testing.T) {
	recs := stepstest.NewRecords()
	recs.Unread()
	m := New(Options{Registry: stepstest.NewRegistry(t), Records: recs, Owners: stepstest.NewOwners("gw-a"), Leader: stepstest.Leading{},
		Pod: steppod.Options{Installation: "jetway"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool {
		err := m.Ready()
		return err != nil && strings.Contains(err.Error(), "not read yet")
	}, time.Second, time.Millisecond)
	_, err := m.Get(Caller{Admin: true}, "", "build-1")
	assert.ErrorIs(t, err, wire.ErrUnavailable)
	assert.ErrorContains(t, err, "the step records are not read yet")
	_, _, err = m.Submit(Caller{Admin: true}, validRequest())
	assert.ErrorIs(t, err, wire.ErrUnavailable)
}

// Without a place to keep them, steps are refused, saying why.
func TestNoStateRefusesSteps(t *testing.T) {
	m := New(Options{Registry: stepstest.NewRegistry(t), Unavailable: "no state namespace to keep them in"})
	_, _, err := m.Submit(Caller{Admin: true}, validRequest())
	assert.ErrorIs(t, err, wire.ErrUnavailable)
	assert.ErrorContains(t, err, "no state namespace to keep them in")
}

// TestQueueIsFirstComeFirstServedWithinLimits: steps that wait for room
// are placed in the order they came, and a limit holds: each placed step
// counts against its target until its pod shows in the watch.
func TestQueueIsFirstComeFirstServedWithinLimits(t *testing.T) {
	reg := stepstest.SilentRegistry(t, stepstest.Running("a", targets.Metadata{}), stepstest.Running("b", targets.Metadata{}))
	var mu sync.Mutex
	clock := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Millisecond)
		return clock
	}
	m := stepstest.Start(t, Options{Registry: reg, Now: now,
		Placement: PlacementOptions{Strategy: selection.Chain{selection.LimitActiveTasks}, Limits: selection.Limits{ActiveTasks: 2}}})
	var handles []string
	for i := range 7 {
		req := validRequest()
		req.Handle = fmt.Sprintf("task-%d", i)
		_, _, err := m.Submit(Caller{Admin: true}, req)
		require.NoError(t, err)
		handles = append(handles, req.Handle)
	}
	placedOn := func() map[string]string {
		out := map[string]string{}
		for _, h := range handles {
			if r, ok := m.Records.Get(RecordName("jetway", "", h)); ok && r.Status.Placed != nil {
				out[h] = r.Status.Placed.Target
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(placedOn()) == 4 }, 5*time.Second, time.Millisecond)
	got := placedOn()
	var firsts []string
	perTarget := map[string]int{}
	for h, tg := range got {
		firsts = append(firsts, h)
		perTarget[tg]++
	}
	slices.Sort(firsts)
	assert.Equal(t, []string{"task-0", "task-1", "task-2", "task-3"}, firsts, "the first four came first")
	assert.Equal(t, map[string]int{"a": 2, "b": 2}, perTarget)
	waiting := firstEvents(t, m.Manager, Caller{Admin: true}, "", "task-4", 1)[0]
	assert.Equal(t, wire.ReasonTargetsAtLimit, waiting.Reason)
	assert.Equal(t, "every compatible target is at a limit (an untagged step without team or platform); placed as soon as one has room: "+
		"a, b: at limit active-tasks 2/2", waiting.Message)
}

// TestWaitingNamesEachRefusal: a step no target fits names why each
// target its team may see refuses it, as gateway place does; another
// team's targets stay unnamed.
func TestWaitingNamesEachRefusal(t *testing.T) {
	reg := stepstest.NewRegistry(t, stepstest.Running("gpu-1", targets.Metadata{Tags: []string{"gpu"}}),
		stepstest.Running("gpu-2", targets.Metadata{Tags: []string{"gpu"}}), stepstest.Running("mac", targets.Metadata{Platform: "darwin"}),
		stepstest.Running("theirs", targets.Metadata{Team: "other"}), targets.Status{Name: "down", State: targets.StateStalled, Meta: targets.Metadata{Platform: "linux"}})
	m := stepstest.Start(t, Options{Registry: reg})
	req := validRequest()
	req.Platform = "linux"
	_, _, err := m.Submit(Caller{Team: "main"}, req)
	require.NoError(t, err)
	waiting := firstEvents(t, m.Manager, Caller{Team: "main"}, "", req.Handle, 1)[0]
	assert.Equal(t, wire.ReasonNoTargetFits, waiting.Reason)
	assert.Equal(t, "no target satisfies team 'main', platform 'linux': down: state stalled; gpu-1, gpu-2: untagged step; mac: platform darwin",
		waiting.Message)

	// A target that fits appears: the step is placed on it.
	reg.Set(t, append(reg.Snapshot(), stepstest.Running("plain", targets.Metadata{}))...)
	require.Eventually(t, func() bool {
		v, err := m.Get(Caller{Team: "main"}, "", req.Handle)
		return err == nil && v.Target == "plain"
	}, 5*time.Second, time.Millisecond)
	evs := firstEvents(t, m.Manager, Caller{Team: "main"}, "", req.Handle, 2)
	assert.Equal(t, wire.EventPlaced, evs[1].Type)
	assert.Equal(t, 1, evs[1].N)
}

func validRequest() wire.Request {
	return wire.Request{Handle: "build-1", Type: "task", Image: "busybox", Run: wire.Run{Path: "sh", Args: []string{"-c", "true"}}}
}

// TestAPrivilegedStepGoesOnlyWhereItsTargetAllows: a privileged step
// waits while no target's policy allows it, naming the policy of each
// that refuses; a target that allows it appears and takes it.
func TestAPrivilegedStepGoesOnlyWhereItsTargetAllows(t *testing.T) {
	reg := stepstest.NewRegistry(t, stepstest.Running("plain", targets.Metadata{}))
	m := stepstest.Start(t, Options{Registry: reg})
	req := validRequest()
	req.Privileged = true
	_, _, err := m.Submit(Caller{Team: "main"}, req)
	require.NoError(t, err)
	waiting := firstEvents(t, m.Manager, Caller{Team: "main"}, "", req.Handle, 1)[0]
	assert.Equal(t, wire.ReasonNoTargetFits, waiting.Reason)
	assert.Equal(t, "no target satisfies team 'main', privileged: plain: privileged step; the target's policy does not allow it "+
		"(steps.allowPrivileged in its target.yaml)", waiting.Message)

	reg.Set(t, append(reg.Snapshot(), stepstest.Running("trusted", targets.Metadata{Steps: targets.StepPolicy{AllowPrivileged: true}}))...)
	require.Eventually(t, func() bool {
		v, err := m.Get(Caller{Team: "main"}, "", req.Handle)
		return err == nil && v.Target == "trusted"
	}, 5*time.Second, time.Millisecond)
}
