package steps

import (
	"context"
	"errors"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/targets"
)

// TestFollowGivesUpOnAnUnreachableStep: a step whose agent cannot be
// reached at all (its cluster is gone) errors after lostAfter instead of
// running forever; until then jetway keeps trying, with backoff.
func TestFollowGivesUpOnAnUnreachableStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"}}, "jetway")
		require.NoError(t, err)
		calls := 0
		m := New(Options{Registry: emptyRegistry{}, Exec: func(context.Context, *targets.Target, string, []string, []byte, io.Writer) error {
			calls++
			return errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
		}})
		s := newStep(key{"", "h"}, validRequest(), callerLabel{}, time.Now())
		r := &runner{m: m, s: s, t: tgt, pod: "h-0123456789"}
		start := time.Now()
		_, err = r.follow(context.Background())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "lost contact with the step for 5m0s: dial tcp 127.0.0.1:1")
		assert.GreaterOrEqual(t, time.Since(start), lostAfter)
		assert.Less(t, time.Since(start), lostAfter+5*time.Second, "retries at most every 2 s (jittered)")
		assert.Greater(t, calls, 100, "it kept trying")
	})
}
