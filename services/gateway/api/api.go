// Package api is the gateway's JSON face: the webhook endpoints, the
// queue API, the probes and /metrics. What it answers about jobs comes
// from package jobs, which the dashboard (package ui) asks too; this
// package only translates requests into its calls and its answers and
// refusals into JSON.
package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/jobs"
	"github.com/orch-dev/orch/services/gateway/metrics"
	"github.com/orch-dev/orch/services/gateway/planenames"
	"github.com/orch-dev/orch/services/gateway/queue"
	"github.com/orch-dev/orch/services/gateway/throttle"
)

// RecentLimitDefault is how many jobs GET /queue lists without ?limit=.
const RecentLimitDefault = 20

// RecentLimitMax bounds ?limit= of GET /queue.
const RecentLimitMax = 1000

// Server answers the gateway's JSON requests. Its exported fields are set
// before Handler is called.
type Server struct {
	// Jobs answers every read and action on jobs.
	Jobs *jobs.Service
	// Queue takes the webhooks' jobs (intake, beside Jobs).
	Queue        *queue.Queue
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
	// Webhooks bounds the deliveries read at once and how long a body
	// may take (see WebhookLimits).
	Webhooks WebhookLimits
	// PlaneNames finds a Plane work item's readable name (WID-41) for
	// the task; nil names tasks by their items' ids.
	PlaneNames *planenames.Resolver
	// PlaneAgentSecret verifies the deliveries of a Plane agent app
	// (POST /webhooks/plane-agent); empty refuses them all (401).
	PlaneAgentSecret string
}

// Handler returns the JSON face's router. It answers paths it does not
// know with a JSON 404; the gateway mounts the dashboard beside it and
// wraps both in WithRequestID.
func (s *Server) Handler() http.Handler {
	r := mux.NewRouter()
	// Open: the senders of webhooks and the probes, which hold no token.
	r.HandleFunc("/webhooks/gitea", s.giteaWebhook).Methods(http.MethodPost)
	r.HandleFunc("/webhooks/plane", s.planeWebhook).Methods(http.MethodPost)
	r.HandleFunc("/webhooks/plane-agent", s.planeAgentWebhook).Methods(http.MethodPost)
	r.HandleFunc("/healthz", service.Healthz).Methods(http.MethodGet)
	r.Handle("/readyz", service.Readyz(s.Jobs.Ready, s.readyDetail)).Methods(http.MethodGet)
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
	private.HandleFunc("/projects/{key}/pause", s.pauseProject).Methods(http.MethodPost)
	private.HandleFunc("/projects/{key}/resume", s.resumeProject).Methods(http.MethodPost)
	private.HandleFunc("/jobs/{id}/release", s.release).Methods(http.MethodPost)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed here")
	})
	return r
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

// writeRefusal answers a refusal of the job service with its status; 503
// asks the client to try again in a few seconds.
func writeRefusal(w http.ResponseWriter, err error) {
	ref := jobs.RefusalOf(err)
	if ref.Code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	writeError(w, ref.Code, ref.Msg)
}

// readyDetail is what GET /readyz says beside ready or not: the spool's
// depth and its oldest entry's age. A spool that does not drain leaves
// the gateway ready (it still takes webhooks, onto its disk), so the body
// says it instead.
func (s *Server) readyDetail() map[string]any {
	return map[string]any{"spool": s.Jobs.Spool()}
}

// QueueAnswer is the body of GET /queue.
type QueueAnswer = jobs.Summary

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
	writeJSON(w, http.StatusOK, s.Jobs.Queue(r.Context(), limit))
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

// lookup reads the record of job {id}, answering the refusal itself when
// there is none to read.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*proto.Status, bool) {
	st, err := s.Jobs.Job(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeRefusal(w, err)
		return nil, false
	}
	return st, true
}

func (s *Server) job(w http.ResponseWriter, r *http.Request) {
	if st, ok := s.lookup(w, r); ok {
		writeJSON(w, http.StatusOK, JobAnswer{Job: st.Job, Status: &JobStatus{Status: *st}})
	}
}
