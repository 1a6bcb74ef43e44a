// Package backoff has the two pieces every retry loop of jetway shares:
// a wait that ends with its context, and a jitter that keeps many
// waiters from waking together.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Sleep waits d, or until ctx ends: then it returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Jitter spreads d evenly over d±spread·d (spread between 0 and 1), so
// that retries or checks that began together drift apart.
func Jitter(d time.Duration, spread float64) time.Duration {
	return d + time.Duration((rand.Float64()*2-1)*spread*float64(d))
}
