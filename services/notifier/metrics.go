package notifier

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/writeback"
)

// metrics are the notifier's Prometheus metrics, in a registry of its own
// so that several notifiers (tests, `make run`) can live in one process,
// and the state /readyz reports.
type metrics struct {
	reg          *prometheus.Registry
	sent         prometheus.Counter
	failed       *prometheus.CounterVec
	rateLimited  prometheus.Counter
	deadLettered prometheus.Counter
	advisories   *prometheus.CounterVec
	writes       *prometheus.CounterVec
	// notices counts the budget and pause notices sent (notices.go).
	notices *prometheus.CounterVec
	// writeback is the tracker write-back, once it runs.
	writeback atomic.Pointer[writeback.Writer]
	// addr is where /metrics is served, if it is.
	addr string

	// js is JetStream, once connected; bound is true while the notifier
	// consumes advisories.
	js    atomic.Pointer[jetstream.JetStream]
	nc    atomic.Pointer[nats.Conn]
	bound atomic.Bool
}

// newMetrics makes the metrics, every series of a bounded label served
// from the start at zero.
func newMetrics() *metrics {
	f := service.NewMetrics("notifier")
	m := &metrics{
		reg:          f.Registry,
		sent:         f.Counter("orch_notifier_alerts_sent_total", "Alerts Telegram accepted."),
		failed:       f.CounterVec("orch_notifier_alerts_failed_total", "Alert sends that failed, by cause: rejected (400/401/403/404: token, chat or message) or unavailable (5xx, network); each is retried.", "cause"),
		rateLimited:  f.Counter("orch_notifier_alerts_rate_limited_total", "Alert sends Telegram answered with 429; each is retried after retry_after."),
		deadLettered: f.Counter("orch_notifier_dead_lettered_total", "Jobs copied to "+proto.StreamDLQ+"."),
		advisories:   f.CounterVec("orch_notifier_advisories_total", "Advisories handled in full, by outcome: alerted, logged (no bot token), cancelled, already_handled, unusable.", "outcome"),
		notices:      f.CounterVec("orch_notifier_notices_total", "Notices told once each, by kind: budget (a project's budget spent in a window), pause (a credential at its usage limit).", "kind"),
		writes:       f.CounterVec("orch_notifier_writeback_writes_total", "Writes to the trackers (tracking comments, commit statuses), by tracker (gitea, plane), operation (comment, status) and outcome: ok, retry (5xx, 429, network; tried again), gone (404; the job's write-back stops), rejected (401, 403, 422; needs a person).", "tracker", "operation", "outcome"),
	}
	f.GaugeFunc("orch_notifier_dlq_messages", "Jobs in "+proto.StreamDLQ+" (failed for good, kept for inspection and re-run).", dlqMessages(m.jetStream))
	f.GaugeFunc("orch_notifier_writeback_pending_jobs", "Jobs this notifier has a tracker write left for (coalescing, backing off, or leased by another notifier); 0 without write-back.", m.writebackPending)
	f.Register(queueCollector{m.jetStream})
	for _, tr := range writeback.Trackers {
		for _, op := range writeback.Operations {
			for _, o := range writeback.Outcomes {
				m.writes.WithLabelValues(tr, op, o)
			}
		}
	}
	for _, c := range []string{"rejected", "unavailable"} {
		m.failed.WithLabelValues(c)
	}
	for _, o := range []string{outcomeAlerted, outcomeLogged, outcomeCancelled, outcomeDone, "unusable"} {
		m.advisories.WithLabelValues(o)
	}
	for _, k := range []string{"budget", "pause"} {
		m.notices.WithLabelValues(k)
	}
	return m
}

// writebackPending is the jobs the write-back has a write left for; 0
// before it runs.
func (m *metrics) writebackPending() float64 {
	if w := m.writeback.Load(); w != nil {
		return float64(w.Pending())
	}
	return 0
}

// Wrote counts one write to a tracker (writeback.Recorder).
func (m *metrics) Wrote(tracker, op, outcome string) {
	m.writes.WithLabelValues(tracker, op, outcome).Inc()
}

var _ writeback.Recorder = (*metrics)(nil)

// connected gives the metrics the NATS connection, once there is one.
func (m *metrics) connected(nc *nats.Conn, js jetstream.JetStream) {
	m.nc.Store(nc)
	m.js.Store(&js)
}

// jetStream is JetStream, or nil before the notifier connected.
func (m *metrics) jetStream() jetstream.JetStream {
	if p := m.js.Load(); p != nil {
		return *p
	}
	return nil
}

// ready is /readyz: NATS connected and the advisory consumer bound.
func (m *metrics) ready() error {
	return service.Ready(m.nc.Load(), m.bound.Load(), proto.ConsumerNotifier+": not taking advisories")
}

// dlqMessages reads the messages in JOBS_DLQ from JetStream at each
// scrape; when it cannot answer, it gives the last known figure.
func dlqMessages(jetStream func() jetstream.JetStream) func() float64 {
	var last atomic.Uint64
	last.Store(math.Float64bits(math.NaN()))
	return func() float64 {
		js := jetStream()
		if js == nil {
			return math.Float64frombits(last.Load())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if s, err := js.Stream(ctx, proto.StreamDLQ); err == nil {
			if info, err := s.Info(ctx); err == nil {
				last.Store(math.Float64bits(float64(info.State.Msgs)))
			}
		}
		return math.Float64frombits(last.Load())
	}
}
