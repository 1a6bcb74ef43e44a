package steps_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/stepagent"
	. "github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/steps/stepstest"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// TestFollowGivesUpOnAnUnreachableStep: a step whose agent cannot be
// reached at all (its cluster is gone) errors after lostAfter instead of
// running forever; until then jetway keeps trying, with backoff.
func TestFollowGivesUpOnAnUnreachableStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := stepstest.NewRegistry(t, stepstest.Running("east", targets.Metadata{}))
		recs := stepstest.NewRecords()
		// The exec is never sent: its pod cannot be read to check that it is
		// jetway's, from the API server that cannot be reached either.
		m := New(Options{Registry: reg, Records: recs, Owners: stepstest.NewOwners("gw-a"), Leader: stepstest.Leading{},
			Exec: func(context.Context, *targets.Target, string, string, []string, []byte, io.Writer) error {
				t.Error("an exec was sent to a pod not known to be jetway's")
				return errors.New("sent")
			}})
		rec, _, err := recs.Create(context.Background(), SummaryOf(validRequest(), false, time.Now()), Status{Owner: "gw-a", Started: time.Now()}, nil)
		require.NoError(t, err)
		start := time.Now()
		err = m.FollowPlaced(context.Background(), rec, Placed{Target: "east", Pod: "h-0123456789"})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "lost contact with the step for 5m0s: pod h-0123456789: Get")
		assert.Contains(t, err.Error(), "dial tcp 127.0.0.1:1")
		assert.GreaterOrEqual(t, time.Since(start), LostAfter, "it kept trying until then")
		assert.Less(t, time.Since(start), LostAfter+5*time.Second, "retries at most every 2 s (jittered)")
	})
}

// TestStatusEventOfEachEnd: how each end the agent records becomes the
// step's last event; a process the kernel killed at its memory limit
// failed, like an exit status, and says OOMKilled with its container.
func TestStatusEventOfEachEnd(t *testing.T) {
	for _, c := range []struct {
		st                 stepagent.Status
		typ, reason, inMsg string
		phase              wire.Phase
	}{
		{stepagent.Status{Reason: stepagent.ReasonExited}, wire.EventExited, "", "", wire.Succeeded},
		{stepagent.Status{Reason: stepagent.ReasonExited, ExitStatus: 3}, wire.EventExited, "", "", wire.Failed},
		{stepagent.Status{Reason: stepagent.ReasonExited, ExitStatus: 137, Signal: "killed"}, wire.EventExited, "killed", "", wire.Failed},
		{stepagent.Status{Reason: stepagent.ReasonOOMKilled, ExitStatus: 137, Signal: "killed", Message: "memory limit"},
			wire.EventExited, "OOMKilled", `container "step": OOMKilled (137): memory limit`, wire.Failed},
		{stepagent.Status{Reason: stepagent.ReasonAborted, ExitStatus: 143}, wire.EventFailed, stepagent.ReasonAborted, "", wire.Aborted},
		{stepagent.Status{Reason: stepagent.ReasonTimeout, ExitStatus: 143}, wire.EventFailed, stepagent.ReasonTimeout, "", wire.Errored},
		{stepagent.Status{Reason: stepagent.ReasonLost, ExitStatus: 1}, wire.EventFailed, stepagent.ReasonLost, "", wire.Errored},
	} {
		e := StatusEvent(c.st)
		assert.Equal(t, c.typ, e.Type, "%+v", c.st)
		assert.Equal(t, c.phase, e.Phase, "%+v", c.st)
		assert.Equal(t, c.reason, e.Reason, "%+v", c.st)
		assert.Contains(t, e.Message, c.inMsg, "%+v", c.st)
		assert.Equal(t, c.st.ExitStatus, *e.ExitStatus)
	}
}
