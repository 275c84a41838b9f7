package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// NewRegistry is a Prometheus registry of one service's own, so that
// several services (`make run`, tests) can live in one process. It holds
// the Go runtime and process collectors and orch_build_info, whose labels
// say which service, version and Go release answer the scrape.
func NewRegistry(name string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "orch_build_info",
		Help:        "Always 1; the labels name the service, its version and the Go release it was built with.",
		ConstLabels: prometheus.Labels{"service": name, "version": Version(), "goversion": runtime.Version()},
	})
	info.Set(1)
	reg.MustRegister(info,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// Timeouts of every orch HTTP server. A request is small (a webhook, a
// probe, a scrape, a page) and Gitea waits 5 s for a webhook's answer, so
// slow clients are cut off early; an answer that streams (a followed log)
// lifts its own write deadline.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 30 * time.Second
	IdleTimeout       = 2 * time.Minute
)

// NewServer is an HTTP server for h with orch's timeouts, logging its
// own errors (a refused TLS handshake, a broken connection) to log.
func NewServer(h http.Handler, log *zap.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          zap.NewStdLog(log),
	}
}

// Healthz answers GET /healthz: 200 while the process serves. It asks
// nothing else, so an orchestrator restarts only a process that no longer
// answers.
func Healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readyz answers GET /readyz: 200 {"status":"ready"} while ready returns
// nil, 503 {"error": what ready returned} otherwise. detail, when not
// nil, adds its fields to either answer, so that a probe's body can say
// more than yes or no (the gateway names its spool's depth and oldest
// age, which do not make it unready).
func Readyz(ready func() error, detail func() map[string]any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var body map[string]any
		if detail != nil {
			body = detail()
		}
		if body == nil {
			body = map[string]any{}
		}
		code := http.StatusOK
		if err := ready(); err != nil {
			code, body["error"] = http.StatusServiceUnavailable, err.Error()
		} else {
			body["status"] = "ready"
		}
		writeJSON(w, code, body)
	})
}

// HTTP is the small HTTP server the runner and the notifier run on
// ORCH_HTTP_ADDR: /healthz answers 200 while the process serves, /readyz
// answers 200 once ready says so and 503 with its reason before, and
// /metrics serves the service's registry.
type HTTP struct {
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// ServeHTTP serves on ln, or, when ln is nil, on a new listener on addr.
// With neither it serves nothing and returns nil: a service started from
// Go without an address (tests, several runners in one process) has no
// listener. ready is asked at every /readyz and returns why the service
// is not ready, or nil.
func ServeHTTP(addr string, ln net.Listener, reg *prometheus.Registry, ready func() error, log *zap.Logger) (*HTTP, error) {
	return ServeHTTPDetail(addr, ln, reg, ready, nil, log)
}

// ServeHTTPDetail is ServeHTTP with detail's fields in every /readyz
// answer (see Readyz): the runner says there how it confines its agents.
func ServeHTTPDetail(addr string, ln net.Listener, reg *prometheus.Registry, ready func() error, detail func() map[string]any, log *zap.Logger) (*HTTP, error) {
	if ln == nil {
		if addr == "" {
			return nil, nil
		}
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("ORCH_HTTP_ADDR: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", Healthz)
	mux.Handle("GET /readyz", Readyz(ready, detail))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	h := &HTTP{ln: ln, srv: NewServer(mux, log)}
	h.wg.Go(func() {
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http listener", zap.Error(err))
		}
	})
	log.Info("serving /healthz, /readyz and /metrics", zap.String("addr", ln.Addr().String()))
	return h, nil
}

// Addr is the address the server listens on.
func (h *HTTP) Addr() string {
	if h == nil {
		return ""
	}
	return h.ln.Addr().String()
}

// Stop stops serving, letting a scrape in flight finish within 5s. It may
// be called on a nil *HTTP.
func (h *HTTP) Stop() {
	if h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	h.wg.Wait()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Ready is a consumer's /readyz answer: nil once nc is connected and the
// consumer is bound, else what is missing (unbound names the consumer).
func Ready(nc *nats.Conn, bound bool, unbound string) error {
	switch {
	case nc == nil:
		return errors.New("nats: not connected yet")
	case nc.Status() != nats.CONNECTED:
		return errors.New("nats: " + nc.Status().String())
	case !bound:
		return errors.New("consumer " + unbound)
	}
	return nil
}
