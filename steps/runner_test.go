package steps

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/targets"
)

// TestFollowGivesUpOnAnUnreachableStep: a step whose agent cannot be
// reached at all (its cluster is gone) errors after lostAfter instead of
// running forever; until then jetway keeps trying, with backoff.
func TestFollowGivesUpOnAnUnreachableStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := newFakeRegistry(t, running("east", targets.Metadata{}))
		calls := 0
		recs := newMemRecords()
		m := New(Options{Registry: reg, Records: recs, Owners: newFakeOwners("gw-a"), Leader: leading{},
			Exec: func(context.Context, *targets.Target, string, string, []string, []byte, io.Writer) error {
				calls++
				return errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
			}})
		req := validRequest()
		rec, _, err := recs.Create(context.Background(), summaryOf(req, false, time.Now()), Status{Owner: "gw-a", Started: time.Now()}, nil)
		require.NoError(t, err)
		r := &runner{m: m, name: rec.Name, sum: rec.Summary, placed: Placed{Target: "east", Pod: "h-0123456789"},
			log: slog.New(slog.DiscardHandler)}
		start := time.Now()
		_, err = r.follow(context.Background(), rec)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "lost contact with the step for 5m0s: dial tcp 127.0.0.1:1")
		assert.GreaterOrEqual(t, time.Since(start), lostAfter)
		assert.Less(t, time.Since(start), lostAfter+5*time.Second, "retries at most every 2 s (jittered)")
		assert.Greater(t, calls, 100, "it kept trying")
	})
}
