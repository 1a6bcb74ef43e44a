package backoff

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSleepWaitsOrEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		assert.NoError(t, Sleep(t.Context(), time.Minute))
		assert.Equal(t, time.Minute, time.Since(start))

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		assert.ErrorIs(t, Sleep(ctx, time.Hour), context.DeadlineExceeded)
		assert.Equal(t, time.Second, time.Since(start), "it ends when its context does")
	})
}

func TestJitterStaysWithinItsSpread(t *testing.T) {
	seen := map[bool]bool{}
	for range 1000 {
		d := Jitter(time.Second, 0.2)
		assert.GreaterOrEqual(t, d, 800*time.Millisecond)
		assert.LessOrEqual(t, d, 1200*time.Millisecond)
		seen[d > time.Second] = true
	}
	assert.Len(t, seen, 2, "it spreads both ways")
	assert.Equal(t, time.Second, Jitter(time.Second, 0))
}
