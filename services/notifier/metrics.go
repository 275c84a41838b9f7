package notifier

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
)

// metrics are the notifier's Prometheus metrics, in a registry of its own
// so that several notifiers (tests, `make run`) can live in one process.
type metrics struct {
	reg          *prometheus.Registry
	sent         prometheus.Counter
	failed       *prometheus.CounterVec
	rateLimited  prometheus.Counter
	deadLettered prometheus.Counter
	advisories   *prometheus.CounterVec
	// addr is where /metrics is served, once it is.
	addr string
}

func newMetrics(js jetstream.JetStream) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orch_notifier_alerts_sent_total",
			Help: "Alerts Telegram accepted.",
		}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orch_notifier_alerts_failed_total",
			Help: "Alert sends that failed, by cause: rejected (400/401/403/404: token, chat or message) or unavailable (5xx, network); each is retried.",
		}, []string{"cause"}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orch_notifier_alerts_rate_limited_total",
			Help: "Alert sends Telegram answered with 429; each is retried after retry_after.",
		}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orch_notifier_dead_lettered_total",
			Help: "Jobs copied to " + proto.StreamDLQ + ".",
		}),
		advisories: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orch_notifier_advisories_total",
			Help: "Advisories handled in full, by outcome: alerted, logged (no bot token), cancelled, already_handled, unusable.",
		}, []string{"outcome"}),
	}
	for _, c := range []string{"rejected", "unavailable"} {
		m.failed.WithLabelValues(c)
	}
	m.reg.MustRegister(m.sent, m.failed, m.rateLimited, m.deadLettered, m.advisories,
		dlqGauge(js),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// dlqGauge reports the messages in JOBS_DLQ, asked of JetStream at each
// scrape; when it cannot answer, the last known figure.
func dlqGauge(js jetstream.JetStream) prometheus.Collector {
	var last atomic.Uint64
	last.Store(math.Float64bits(math.NaN()))
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "orch_notifier_dlq_messages",
		Help: "Jobs in " + proto.StreamDLQ + " (failed for good, kept for inspection and re-run).",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if s, err := js.Stream(ctx, proto.StreamDLQ); err == nil {
			if info, err := s.Info(ctx); err == nil {
				last.Store(math.Float64bits(float64(info.State.Msgs)))
			}
		}
		return math.Float64frombits(last.Load())
	})
}

// serve serves /metrics on addr until the returned stop is called. An
// empty addr serves nothing.
func (m *metrics) serve(addr string, log *zap.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ORCH_METRICS_ADDR: %w", err)
	}
	m.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener", zap.Error(err))
		}
	})
	log.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		wg.Wait()
	}, nil
}
