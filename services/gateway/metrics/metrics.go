// Package metrics holds the gateway's Prometheus metrics, in a registry of
// their own so that several gateways (tests) can live in one process.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
)

// Outcomes of a webhook, the values of the outcome label.
const (
	OutcomeQueued       = "queued"
	OutcomeSpooled      = "spooled"
	OutcomeIgnored      = "ignored"
	OutcomeUnauthorized = "unauthorized"
	OutcomeMalformed    = "malformed"
	OutcomeTooLarge     = "too_large"
	OutcomeUnsupported  = "unsupported_media_type"
	OutcomeFailed       = "failed"
	// OutcomeBusy is a delivery answered 503 because every body slot
	// (ORCH_MAX_CONCURRENT_WEBHOOKS) stayed taken.
	OutcomeBusy = "busy"
	// OutcomeTimeout is a delivery whose body did not arrive in time.
	OutcomeTimeout = "timeout"
)

// Spool is what the metrics read of the spool at every scrape.
type Spool interface {
	Depth() int
	OldestAge() time.Duration
	Quarantined() uint64
}

// Metrics are the gateway's metrics.
type Metrics struct {
	reg *prometheus.Registry
	// Webhooks counts deliveries by source (gitea, plane), event and
	// outcome; the event label is set through EventLabel only.
	Webhooks *prometheus.CounterVec
	// Publish observes how long JetStream took to hold a job.
	Publish prometheus.Histogram
	// Drained counts spool entries carried out.
	Drained prometheus.Counter
	// JobsCut counts jobs whose text was cut to fit ORCH_MAX_TASK_BYTES.
	JobsCut prometheus.Counter
	// WebhooksInFlight is the webhooks holding a body slot: being read,
	// decided or answered.
	WebhooksInFlight prometheus.Gauge
	// Reloads counts registry reloads by result (ok, error).
	Reloads *prometheus.CounterVec
}

// New builds the metrics. sp and jobCounts are read at every scrape, so
// the figures are never stale.
func New(sp Spool, jobCounts func() map[proto.State]int) *Metrics {
	f := service.NewMetrics("gateway")
	m := &Metrics{
		reg:      f.Registry,
		Webhooks: f.CounterVec("orch_gateway_webhooks_total", "Webhook deliveries by source, event and outcome.", "source", "event", "outcome"),
		Publish: f.Histogram("orch_gateway_publish_seconds", "Time until JetStream acknowledged a published job.",
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}),
		Drained: f.Counter("orch_gateway_spool_drained_total", "Spooled events carried out once JetStream was back."),
		Reloads: f.CounterVec("orch_gateway_registry_reloads_total", "Project registry reloads (SIGHUP) by result.", "result"),
		JobsCut: f.Counter("orch_gateway_jobs_cut_total", "Jobs whose person-written text was cut to fit ORCH_MAX_TASK_BYTES."),
		WebhooksInFlight: f.Gauge("orch_gateway_webhooks_in_flight",
			"Webhook deliveries holding one of the ORCH_MAX_CONCURRENT_WEBHOOKS body slots."),
	}
	f.GaugeFunc("orch_gateway_spool_depth", "Events kept on local disk, waiting for JetStream.",
		func() float64 { return float64(sp.Depth()) })
	f.GaugeFunc("orch_gateway_spool_oldest_age_seconds", "How long the oldest event in the spool has waited; 0 when it is empty.",
		func() float64 { return sp.OldestAge().Seconds() })
	f.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "orch_gateway_spool_quarantined_total",
		Help: "Spool entries that can never be carried out, moved to the spool's quarantine directory.",
	}, func() float64 { return float64(sp.Quarantined()) }))
	f.Register(jobsCollector{jobCounts})
	// Every series an unverified delivery can touch exists from the start
	// (at zero), so a scrape shows the same series before and after any
	// amount of unauthenticated traffic.
	for source := range knownEvents {
		for _, outcome := range Outcomes {
			m.Webhooks.WithLabelValues(source, EventOther, outcome)
		}
	}
	// Both results are served from the start, so that a rate over them
	// has a zero to start from.
	m.Reloads.WithLabelValues("ok")
	m.Reloads.WithLabelValues("error")
	return m
}

// Gatherer is the registry the metrics are in, for tests that count
// series.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ObservePublish records one publish that took since start.
func (m *Metrics) ObservePublish(start time.Time) {
	m.Publish.Observe(time.Since(start).Seconds())
}

var jobsDesc = prometheus.NewDesc("orch_jobs", "Jobs by state, as the status bucket says now.", []string{"state"}, nil)

// jobsCollector reports the index's count of jobs per state.
type jobsCollector struct {
	counts func() map[proto.State]int
}

func (c jobsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- jobsDesc }

func (c jobsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.counts()
	for _, s := range proto.States {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}
