package service

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics makes a service's metrics in its own registry, each registered
// as it is made: a metric declared is a metric served, and each
// declaration is its name, help and labels on one line.
type Metrics struct {
	// Registry holds the metrics, with NewRegistry's collectors.
	Registry *prometheus.Registry
	f        promauto.Factory
}

// NewMetrics starts the metrics of the service name, in a registry from
// NewRegistry.
func NewMetrics(name string) Metrics {
	reg := NewRegistry(name)
	return Metrics{Registry: reg, f: promauto.With(reg)}
}

// Counter is a counter without labels.
func (m Metrics) Counter(name, help string) prometheus.Counter {
	return m.f.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec is a counter with labels.
func (m Metrics) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return m.f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge is a gauge without labels.
func (m Metrics) Gauge(name, help string) prometheus.Gauge {
	return m.f.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec is a gauge with labels.
func (m Metrics) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return m.f.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// GaugeFunc is a gauge whose value value reads at every scrape, so that
// it is never stale.
func (m Metrics) GaugeFunc(name, help string, value func() float64) prometheus.GaugeFunc {
	return m.f.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, value)
}

// Histogram is a histogram without labels, with buckets.
func (m Metrics) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return m.f.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// HistogramVec is a histogram with buckets and labels.
func (m Metrics) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return m.f.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

// Register registers collectors made otherwise (a custom Collector).
func (m Metrics) Register(cs ...prometheus.Collector) { m.Registry.MustRegister(cs...) }
