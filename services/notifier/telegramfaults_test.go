package notifier

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

func TestRateLimitedTwiceThenAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tg.SetAnswer(func(n int) (int, string) {
		if n <= 2 {
			return http.StatusTooManyRequests, testkit.Answer429
		}
		return http.StatusOK, ""
	})
	r := b.start(b.config(), hooks{})
	job := b.queue("one", "Rate limited")
	began := time.Now()
	b.run(map[string]action{job.ID: actFail})
	b.settled(30 * time.Second)

	b.checkDeadLettered(job)
	if n := b.tg.Requests(); n != 3 {
		t.Errorf("%d requests, want 3 (429, 429, 200)", n)
	}
	if d := time.Since(began); d < 2*time.Second {
		t.Errorf("done after %v: retry_after 1 was not honoured twice", d)
	}
	if n := testutil.ToFloat64(r.n.metrics.rateLimited); n != 2 {
		t.Errorf("rate-limited counter %v, want 2", n)
	}
}

func TestTelegramDownForAWhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var up atomic.Bool
	b.tg.SetAnswer(func(int) (int, string) {
		if !up.Load() {
			return http.StatusInternalServerError, testkit.Answer500
		}
		return http.StatusOK, ""
	})
	r := b.start(b.config(), hooks{})
	jobs := map[string]action{}
	var all []*proto.Job
	for i := range 3 {
		j := b.queue(strconv.Itoa(i), "Down "+strconv.Itoa(i))
		jobs[j.ID], all = actFail, append(all, j)
	}
	b.run(jobs)
	// Several tries fail. Alerts go out in order (MaxAckPending 1), so
	// the others wait behind the first, whose job is dead-lettered
	// already.
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := b.tg.Requests(); n < 6 {
			return fmt.Errorf("%d requests", n)
		}
		if n := b.streamMsgs(proto.StreamDLQ); n < 1 {
			return fmt.Errorf("DLQ holds %d jobs during the outage, want at least 1", n)
		}
		return nil
	})
	if n := len(b.tg.Messages()); n != 0 {
		t.Fatalf("%d messages accepted while Telegram answered 500", n)
	}
	up.Store(true)
	b.settled(30 * time.Second)
	b.checkDeadLettered(all...)
	if n := testutil.ToFloat64(r.n.metrics.failed.WithLabelValues("unavailable")); n < 6 {
		t.Errorf("failed{unavailable} = %v, want at least 6", n)
	}
}

func TestRejectedIsKeptNotSpunOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fixed atomic.Bool
	b.tg.SetAnswer(func(n int) (int, string) {
		if fixed.Load() {
			return http.StatusOK, ""
		}
		if n%2 == 1 {
			return http.StatusUnauthorized, testkit.Answer401
		}
		return http.StatusBadRequest, testkit.Answer400
	})
	cfg := b.config()
	cfg.RejectedDelay = 3 * time.Second
	r := b.start(cfg, hooks{})
	job := b.queue("one", "Bad token")
	b.run(map[string]action{job.ID: actFail})
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := testutil.ToFloat64(r.n.metrics.failed.WithLabelValues("rejected")); n != 1 {
			return fmt.Errorf("failed{rejected} = %v", n)
		}
		return nil
	})
	// Dead-lettered at once, even though nobody could be told.
	if n := b.streamMsgs(proto.StreamDLQ); n != 1 {
		t.Errorf("DLQ holds %d, want 1", n)
	}
	if st, _, err := b.status.Get(b.ctx(), job.ID); err != nil || st.State != proto.StateFailed || st.Alerted {
		t.Errorf("status %+v, %v; want failed, not alerted", st, err)
	}
	// Not spun on: one try, then the advisory is given back with the
	// delay, and nothing is sent until it has passed.
	var nakedAt time.Time
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		naks := b.logs.FilterMessage("advisory will be retried").All()
		if len(naks) == 0 {
			return errors.New("the advisory was not given back")
		}
		if d, _ := naks[0].ContextMap()["delay"].(time.Duration); d != cfg.RejectedDelay {
			t.Fatalf("advisory given back for %v, want ORCH_NOTIFY_REJECTED_DELAY, %v", d, cfg.RejectedDelay)
		}
		nakedAt = naks[0].Time
		return nil
	})
	if n := b.tg.Requests(); n != 1 {
		t.Errorf("%d requests after a 401, want 1", n)
	}
	if !b.logged("TELEGRAM REJECTS ALERTS") {
		t.Error("a rejected alert was not logged loudly")
	}
	fixed.Store(true) // the operator fixes the token
	b.settled(30 * time.Second)
	b.checkDeadLettered(job)
	if msgs := b.tg.Messages(); len(msgs) == 1 && msgs[0].At.Sub(nakedAt) < cfg.RejectedDelay {
		t.Errorf("the alert went out %v after the advisory was given back, want the delay, %v", msgs[0].At.Sub(nakedAt), cfg.RejectedDelay)
	}
}

// Thirty jobs fail at once, with two notifier replicas sharing the
// consumer: every job is alerted exactly once and the pace per chat holds
// across both.
func TestManyFailuresAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rate = 10.0
	cfg := b.config()
	cfg.TelegramRate = rate
	b.start(cfg, hooks{})
	b.start(cfg, hooks{})
	jobs := map[string]action{}
	var all []*proto.Job
	for i := range 30 {
		j := b.queue(strconv.Itoa(i), "Many "+strconv.Itoa(i))
		act := actFail
		if i%3 == 0 {
			act = actTerm
		}
		jobs[j.ID], all = act, append(all, j)
	}
	b.run(jobs)
	b.settled(90 * time.Second)
	b.checkDeadLettered(all...)

	msgs := b.tg.Messages()
	if len(msgs) != 30 {
		t.Fatalf("%d messages, want 30", len(msgs))
	}
	times := make([]time.Time, len(msgs))
	for i, m := range msgs {
		times[i] = m.At
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	interval := time.Duration(float64(time.Second) / rate)
	// Loose: the whole run took at least most of 29 intervals, and
	// hardly two messages came closer than half an interval.
	if span := times[len(times)-1].Sub(times[0]); span < 29*interval*8/10 {
		t.Errorf("30 messages within %v, want at least %v at %v/s", span, 29*interval*8/10, rate)
	}
	close := 0
	for i := 1; i < len(times); i++ {
		if times[i].Sub(times[i-1]) < interval/2 {
			close++
		}
	}
	if close > 5 {
		t.Errorf("%d of 29 gaps shorter than %v", close, interval/2)
	}
}
