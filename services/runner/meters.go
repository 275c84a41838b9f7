package runner

import (
	"time"

	"github.com/orch-dev/orch/services/runner/egress"
)

// usageLimitRetryAfter is the least retry-after of a 429 seen by a job's
// egress proxy that is taken for the account's usage limit rather than
// a rate limit Claude Code rides out with its own retries.
const usageLimitRetryAfter = 5 * time.Minute

// metered is the egress proxy's meter of job id's agent while it runs;
// ok is false for an agent without one (unconfined, or network none).
func (r *Runner) metered(id string) (u egress.Usage, ok bool) {
	v, ok := r.meters.Load(id)
	if !ok {
		return egress.Usage{}, false
	}
	return v.(*egress.Proxy).Usage(), true
}

// meteredSpend is what job id's agent spent by its proxy's meter so far:
// exact where the output's usage is only an estimate.
func (r *Runner) meteredSpend(id string) float64 {
	u, _ := r.metered(id)
	return u.CostUSD
}

// meteredLimit is when the usage limit a 429 with a long retry-after,
// seen by job id's proxy, resets; zero when there was none.
func meteredLimit(u egress.Usage) time.Time {
	if u.RateLimited == 0 || u.RetryAfter < usageLimitRetryAfter {
		return time.Time{}
	}
	return u.RateLimitedAt.Add(u.RetryAfter)
}
