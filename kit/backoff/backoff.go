// Package backoff is orch's one way of waiting between tries: a delay
// doubled per failure up to a cap, with jitter where many waiters fail
// together, and a retry loop and a sleep that end with their context.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Doubling is base doubled n times (once per earlier failure), capped at
// maxDelay. A base of 0 stays 0: try again at once.
func Doubling(base, maxDelay time.Duration, n int) time.Duration {
	d := base
	for range n {
		if d >= maxDelay {
			break
		}
		d *= 2
	}
	return min(d, maxDelay)
}

// Jittered spreads d by up to frac (0.2: ±20 %) either way, never past
// maxDelay, so that waiters that failed together do not try again
// together.
func Jittered(d, maxDelay time.Duration, frac float64) time.Duration {
	jitter := time.Duration((rand.Float64()*2*frac - frac) * float64(d))
	return min(d+jitter, maxDelay)
}

// Sleep waits d, or less if ctx ends first, and reports whether the whole
// of d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Retry calls f until it returns nil or ctx ends, waiting first, then
// twice as long after each failure, up to maxDelay. On ctx's end it
// returns f's last error joined with ctx's.
func Retry(ctx context.Context, first, maxDelay time.Duration, f func() error) error {
	for n := 0; ; n++ {
		err := f()
		if err == nil {
			return nil
		}
		if !Sleep(ctx, Doubling(first, maxDelay, n)) {
			return errors.Join(err, ctx.Err())
		}
	}
}
