package runner

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// retry calls f until it succeeds or ctx ends, backing off from 50ms to 1s.
// It rides out a short NATS outage during a settle.
func retry(ctx context.Context, f func() error) error {
	delay := 50 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// RetryDelay is the delay before attempt+1: base doubled per attempt,
// capped at max, with up to 20% jitter either way so that jobs that failed
// together do not retry together.
func RetryDelay(base, maxDelay time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	jitter := time.Duration((rand.Float64()*0.4 - 0.2) * float64(d))
	return min(d+jitter, maxDelay)
}
