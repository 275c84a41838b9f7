// Package api is the gateway's HTTP surface: the webhook endpoints, the
// queue API and /metrics.
package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/metrics"
	"github.com/orch-dev/orch/services/gateway/queue"
	"github.com/orch-dev/orch/services/gateway/throttle"
)

// RecentLimitDefault is how many jobs GET /queue lists without ?limit=.
const RecentLimitDefault = 20

// RecentLimitMax bounds ?limit= of GET /queue.
const RecentLimitMax = 1000

// Server answers the gateway's HTTP requests. Its exported fields are set
// before Handler is called; Connect is called once NATS is reachable.
type Server struct {
	Log          *zap.Logger
	Queue        *queue.Queue
	Index        *index.Index
	Metrics      *metrics.Metrics
	Registry     func() *registry.Registry
	GiteaSecret  string
	PlaneSecret  string
	APIToken     string
	MaxBodyBytes int64
	Now          func() time.Time
	// Throttle counts wrong tokens per client and refuses a client with
	// too many (429); nil throttles nothing. The dashboard's logins share
	// it.
	Throttle *throttle.Limiter
	// UI, when set, serves the dashboard under /ui/; it checks its own
	// session.
	UI http.Handler
	// Webhooks bounds the deliveries read at once and how long a body
	// may take (see WebhookLimits).
	Webhooks WebhookLimits

	backend atomic.Pointer[backend]
}

type backend struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	status *status.Store
}

// Connect gives the server its NATS connection, once there is one.
func (s *Server) Connect(nc *nats.Conn, js jetstream.JetStream, st *status.Store) {
	s.backend.Store(&backend{nc: nc, js: js, status: st})
}

// Handler returns the router, wrapped in the request id and access log.
func (s *Server) Handler() http.Handler {
	r := mux.NewRouter()
	// Open: the senders of webhooks and the probes, which hold no token.
	r.HandleFunc("/webhooks/gitea", s.giteaWebhook).Methods(http.MethodPost)
	r.HandleFunc("/webhooks/plane", s.planeWebhook).Methods(http.MethodPost)
	r.HandleFunc("/healthz", s.healthz).Methods(http.MethodGet)
	r.HandleFunc("/readyz", s.readyz).Methods(http.MethodGet)
	r.Handle("/metrics", s.Metrics.Handler()).Methods(http.MethodGet)
	// Private: everything that shows or changes a job. The gateway must be
	// reachable by Gitea and Plane, so anyone may reach it; a new endpoint
	// that shows job content joins this router, behind the one check.
	private := r.NewRoute().Subrouter()
	private.Use(s.requireToken)
	private.HandleFunc("/queue", s.queue).Methods(http.MethodGet)
	private.HandleFunc("/jobs", s.enqueue).Methods(http.MethodPost)
	private.HandleFunc("/jobs/{id}", s.job).Methods(http.MethodGet)
	private.HandleFunc("/jobs/{id}/log", s.jobLog).Methods(http.MethodGet)
	private.HandleFunc("/jobs/{id}/cancel", s.cancel).Methods(http.MethodPost)
	private.HandleFunc("/jobs/{id}/retry", s.retry).Methods(http.MethodPost)
	if s.UI != nil {
		r.PathPrefix("/ui/").Handler(s.UI)
		r.Handle("/ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	}
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed here")
	})
	return s.withRequestID(r)
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// ErrorAnswer is the body of every error answer.
type ErrorAnswer struct {
	Error string `json:"error"`
}

// writeError answers {"error": msg}.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, ErrorAnswer{Error: msg})
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readiness is the body of GET /readyz: whether the gateway can queue
// now, and what its spool holds. A spool that does not drain leaves the
// gateway ready (it still takes webhooks, onto its disk), so the body
// says it instead.
type Readiness struct {
	Status string       `json:"status,omitempty"`
	Error  string       `json:"error,omitempty"`
	Spool  SpoolFigures `json:"spool"`
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	ans := Readiness{Status: "ready", Spool: s.spoolFigures()}
	switch b := s.backend.Load(); {
	case b == nil:
		ans.Status, ans.Error = "", "nats: not connected yet"
	case b.nc.Status() != nats.CONNECTED:
		ans.Status, ans.Error = "", "nats: "+b.nc.Status().String()
	}
	code := http.StatusOK
	if ans.Error != "" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, ans)
}

// QueueAnswer is the body of GET /queue.
type QueueAnswer struct {
	Counts   map[proto.State]int `json:"counts"`
	Stream   *StreamFigures      `json:"stream"`
	Consumer *ConsumerFigures    `json:"consumer"`
	Spool    SpoolFigures        `json:"spool"`
	Recent   []index.Recent      `json:"recent"`
}

// StreamFigures are the JOBS stream's figures.
type StreamFigures struct {
	Name     string `json:"name"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
}

// ConsumerFigures are the runner consumer's figures: Pending is waiting for
// a runner, Running is held by one, Redelivered came back at least once.
type ConsumerFigures struct {
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`
	Running     int    `json:"running"`
	Redelivered int    `json:"redelivered"`
	Waiting     int    `json:"waiting"`
}

// SpoolFigures describe the gateway's local spool: Depth events wait for
// JetStream, the oldest of them for OldestAgeSeconds (0 when none waits).
type SpoolFigures struct {
	Depth            int     `json:"depth"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

func (s *Server) spoolFigures() SpoolFigures {
	return SpoolFigures{Depth: s.Queue.SpoolDepth(), OldestAgeSeconds: s.Queue.SpoolOldestAge().Seconds()}
}

func (s *Server) queue(w http.ResponseWriter, r *http.Request) {
	limit := RecentLimitDefault
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > RecentLimitMax {
			writeError(w, http.StatusBadRequest, "limit: want a number from 0 to 1000")
			return
		}
		limit = n
	}
	ans := QueueAnswer{
		Counts: s.Index.Counts(), Recent: s.Index.Recent(limit),
		Spool: s.spoolFigures(),
	}
	ans.Stream, ans.Consumer = s.Figures(r.Context())
	writeJSON(w, http.StatusOK, ans)
}

// JobAnswer is the body of GET /jobs/{id}.
type JobAnswer struct {
	Job    proto.Job  `json:"job"`
	Status *JobStatus `json:"status"`
}

// JobStatus is a status record without the job it carries.
type JobStatus struct {
	proto.Status
	Job *struct{} `json:"job,omitempty"`
}

// status returns the status store, answering 503 when there is none yet.
func (s *Server) status(w http.ResponseWriter) (*backend, bool) {
	b := s.backend.Load()
	if b == nil {
		writeError(w, http.StatusServiceUnavailable, "status store unavailable: not connected to NATS yet")
		return nil, false
	}
	return b, true
}

// jobID reads {id}, answering 404 for one that cannot name a job.
func jobID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := mux.Vars(r)["id"]
	if id == "" || proto.Token(id) != id {
		writeError(w, http.StatusNotFound, "no such job")
		return "", false
	}
	return id, true
}

// lookup reads the record of job {id}, answering 404 or 503 itself when
// there is none to read.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*backend, *proto.Status, bool) {
	id, ok := jobID(w, r)
	if !ok {
		return nil, nil, false
	}
	b, ok := s.status(w)
	if !ok {
		return nil, nil, false
	}
	st, _, err := b.status.Get(r.Context(), id)
	if errors.Is(err, status.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no such job")
		return nil, nil, false
	}
	if err != nil {
		logFrom(r).Warn("reading job", zap.String("job", id), zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "status store unavailable")
		return nil, nil, false
	}
	return b, st, true
}

func (s *Server) job(w http.ResponseWriter, r *http.Request) {
	if _, st, ok := s.lookup(w, r); ok {
		writeJSON(w, http.StatusOK, JobAnswer{Job: st.Job, Status: &JobStatus{Status: *st}})
	}
}
