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

	. "github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/steps/stepstest"
	"github.com/jetway-ci/jetway/targets"
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
