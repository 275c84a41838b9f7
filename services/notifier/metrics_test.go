package notifier

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/metricstest"
	"github.com/orch-dev/orch/kit/natstest"
)

// TestQueueFigures checks the figures an operator alerts on, read from
// JetStream at scrape time: jobs no runner has taken, how old the oldest
// of them is, jobs held by a runner, redeliveries, and advisories waiting.
func TestQueueFigures(t *testing.T) {
	b := setup(t)
	cfg := b.config()
	cfg.HTTPAddr = "127.0.0.1:0"
	r := b.start(cfg, hooks{})
	base := "http://" + r.n.metrics.addr

	if code, body := metricstest.Get(base + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz of a started notifier: %d %s", code, body)
	}
	m := metricstest.Scrape(t, base+"/metrics")
	m.Lint(t)
	for _, s := range []string{"orch_notifier_queue_pending_jobs", "orch_notifier_queue_oldest_pending_age_seconds", "orch_notifier_queue_ack_pending_jobs"} {
		if v, ok := m.Value(s); !ok || v != 0 {
			t.Errorf("%s on an empty queue = %v (present %v), want 0", s, v, ok)
		}
	}

	// Three jobs wait; a runner holds one.
	for i := range 3 {
		b.queue(fmt.Sprint("wait-", i), "waiting")
	}
	held := b.fetch()
	// The figures are polled until the oldest waiting job is over a
	// second old.
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		m = metricstest.Scrape(t, base+"/metrics")
		for s, want := range map[string]float64{
			"orch_notifier_queue_pending_jobs":     2,
			"orch_notifier_queue_ack_pending_jobs": 1,
			"orch_notifier_queue_redelivered_jobs": 0,
		} {
			if v, _ := m.Value(s); v != want {
				return fmt.Errorf("%s = %v, want %v", s, v, want)
			}
		}
		if age, _ := m.Value("orch_notifier_queue_oldest_pending_age_seconds"); age < 1 || age > 60 {
			return fmt.Errorf("oldest waiting job is %vs old, want over 1s", age)
		}
		return nil
	})

	// It gives the job back (a retry) and takes it again: redelivered.
	if err := held.Nak(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		msg := b.fetch()
		if md, err := msg.Metadata(); err != nil || md.NumDelivered < 2 {
			_ = msg.Nak()
			return fmt.Errorf("fetched a first delivery")
		}
		return nil
	})
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		m = metricstest.Scrape(t, base+"/metrics")
		if v, _ := m.Value("orch_notifier_queue_redelivered_jobs"); v < 1 {
			return fmt.Errorf("orch_notifier_queue_redelivered_jobs = %v, want at least 1", v)
		}
		return nil
	})
	if got := m.LabelValues("orch_build_info", "service"); len(got) != 1 || got[0] != "notifier" {
		t.Errorf("orch_build_info services %v, want [notifier]", got)
	}
	m.Lint(t)
}

// fetch takes one job as a runner would and holds it.
func (b *bundle) fetch() jetstream.Msg {
	b.t.Helper()
	batch, err := b.runner.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		b.t.Fatal(err)
	}
	for msg := range batch.Messages() {
		return msg
	}
	b.t.Fatalf("no job to fetch: %v", batch.Error())
	return nil
}
