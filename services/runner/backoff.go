package runner

import (
	"context"
	"time"

	"github.com/orch-dev/orch/kit/backoff"
)

// retry calls f until it succeeds or ctx ends, backing off from 50ms to 1s.
// It rides out a short NATS outage during a settle.
func retry(ctx context.Context, f func() error) error {
	return backoff.Retry(ctx, 50*time.Millisecond, time.Second, f)
}

// RetryDelay is the delay before attempt+1: base doubled per attempt,
// capped at max, with up to 20% jitter either way so that jobs that failed
// together do not retry together.
func RetryDelay(base, maxDelay time.Duration, attempt int) time.Duration {
	return spread(backoff.Doubling(base, maxDelay, attempt-1), maxDelay)
}

// spread is d with up to 20% jitter either way, never past maxDelay.
func spread(d, maxDelay time.Duration) time.Duration {
	return backoff.Jittered(d, maxDelay, 0.2)
}
