// Package api is the gateway's HTTP surface: the webhook endpoints and the
// queue API.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/registry"
	"github.com/orch-dev/orch/proto/status"
	"github.com/orch-dev/orch/services/gateway/queue"
)

// RecentLimitDefault is how many jobs GET /queue lists without ?limit=.
const RecentLimitDefault = 20

// Server answers the gateway's HTTP requests.
type Server struct {
	Log          *zap.Logger
	NC           *nats.Conn
	JS           jetstream.JetStream
	Status       *status.Store
	Queue        *queue.Queue
	Index        *Index
	Registry     func() *registry.Registry
	GiteaSecret  string
	PlaneSecret  string
	MaxBodyBytes int64
	Now          func() time.Time
}

// Handler returns the router.
func (s *Server) Handler() http.Handler {
	r := mux.NewRouter()
	r.HandleFunc("/webhooks/gitea", s.giteaWebhook).Methods(http.MethodPost)
	r.HandleFunc("/webhooks/plane", s.planeWebhook).Methods(http.MethodPost)
	r.HandleFunc("/queue", s.queue).Methods(http.MethodGet)
	r.HandleFunc("/jobs/{id}", s.job).Methods(http.MethodGet)
	r.HandleFunc("/healthz", s.healthz).Methods(http.MethodGet)
	r.HandleFunc("/readyz", s.readyz).Methods(http.MethodGet)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	})
	return r
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers {"error": msg}.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.NC.Status() != nats.CONNECTED {
		writeError(w, http.StatusServiceUnavailable, "nats: "+s.NC.Status().String())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// QueueAnswer is the body of GET /queue.
type QueueAnswer struct {
	Counts   map[proto.State]int `json:"counts"`
	Stream   *StreamFigures      `json:"stream"`
	Consumer *ConsumerFigures    `json:"consumer"`
	Recent   []Recent            `json:"recent"`
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

func (s *Server) queue(w http.ResponseWriter, r *http.Request) {
	limit := RecentLimitDefault
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1000 {
			writeError(w, http.StatusBadRequest, "limit: want a number from 0 to 1000")
			return
		}
		limit = n
	}
	ans := QueueAnswer{Counts: s.Index.Counts(), Recent: s.Index.Recent(limit)}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	// Stream and consumer figures are best effort: the counts and the
	// recent list still answer while NATS is away.
	if st, err := s.JS.Stream(ctx, proto.StreamJobs); err == nil {
		if info, err := st.Info(ctx); err == nil {
			ans.Stream = &StreamFigures{Name: info.Config.Name, Messages: info.State.Msgs, Bytes: info.State.Bytes}
		}
		if c, err := st.Consumer(ctx, proto.ConsumerRunner); err == nil {
			if info, err := c.Info(ctx); err == nil {
				ans.Consumer = &ConsumerFigures{
					Name: info.Name, Pending: info.NumPending, Running: info.NumAckPending,
					Redelivered: info.NumRedelivered, Waiting: info.NumWaiting,
				}
			}
		}
	}
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

func (s *Server) job(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if proto.Token(id) != id {
		writeError(w, http.StatusNotFound, "no such job")
		return
	}
	st, _, err := s.Status.Get(r.Context(), id)
	if errors.Is(err, status.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no such job")
		return
	}
	if err != nil {
		s.Log.Warn("reading job", zap.String("job", id), zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "status store unavailable")
		return
	}
	writeJSON(w, http.StatusOK, JobAnswer{Job: st.Job, Status: &JobStatus{Status: *st}})
}
