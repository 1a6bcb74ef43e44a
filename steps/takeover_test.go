package steps_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steppod"
	. "github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/steps/stepstest"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// TestTakeOverFromAGoneOwner: a step whose owner is gone is taken over
// and driven here; one whose owner lives is left alone; a released one
// stays as it is.
func TestTakeOverFromAGoneOwner(t *testing.T) {
	m := stepstest.Start(t, Options{Registry: stepstest.SilentRegistry(t, stepstest.Running("east", targets.Metadata{}))})
	ctx := context.Background()
	mk := func(handle, owner string, st Status) string {
		req := validRequest()
		req.Handle = handle
		st.Owner = owner
		st.Placed = &Placed{Target: "east", Pod: steppod.Name("", handle), At: time.Now()}
		r, _, err := m.Records.Create(ctx, SummaryOf(req, false, time.Now()), st, nil)
		require.NoError(t, err)
		return r.Name
	}
	gone := mk("gone-owner", "gw-dead", Status{})
	alive := mk("live-owner", "gw-b", Status{})
	released := mk("released", "gw-dead", Status{End: &End{Phase: wire.Succeeded}, Released: time.Now()})
	m.Owners.Kill("gw-dead")
	require.Eventually(t, func() bool {
		r, _ := m.Records.Get(gone)
		return r.Status.Owner == "gw-a"
	}, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return m.Driving(gone) }, 5*time.Second, time.Millisecond, "a step taken over is driven here")
	r, _ := m.Records.Get(alive)
	assert.Equal(t, "gw-b", r.Status.Owner)
	r, _ = m.Records.Get(released)
	assert.Equal(t, "gw-dead", r.Status.Owner, "a released step needs no owner")

	// The step is another's again (this gateway was partitioned, say): its
	// runner stops, and changes nothing in the record.
	_, err := m.Records.Update(ctx, gone, func(r *Record) error { r.Status.Owner = "gw-c"; return nil })
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !m.Driving(gone) }, 5*time.Second, time.Millisecond)
	r, _ = m.Records.Get(gone)
	assert.Equal(t, "gw-c", r.Status.Owner)
	assert.Nil(t, r.Status.End, "the runner that lost the step did not end it")
}
