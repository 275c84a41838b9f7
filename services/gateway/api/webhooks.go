package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/trigger"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// PublishTimeout bounds how long a webhook waits for JetStream. Gitea gives
// up after 5 s, so the answer must come well before.
const PublishTimeout = 3 * time.Second

// JobRef names one queued job in a webhook's answer.
type JobRef struct {
	ID      string     `json:"id"`
	Kind    proto.Kind `json:"kind"`
	Project string     `json:"project"`
	Task    string     `json:"task"`
}

// Accepted is the body of a 202 webhook answer.
type Accepted struct {
	Jobs    []JobRef `json:"jobs"`
	Spooled bool     `json:"spooled,omitempty"`
}

// readBody reads a webhook body up to the limit, answering 413 past it.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, "body larger than ORCH_MAX_BODY_BYTES")
		return nil, false
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

func (s *Server) giteaWebhook(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	if err := webhook.Verify(s.GiteaSecret, body, r.Header.Get(webhook.GiteaSignature)); err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	event, delivery := r.Header.Get(webhook.GiteaEventType), r.Header.Get(webhook.GiteaDelivery)
	log := s.Log.With(zap.String("source", "gitea"), zap.String("event", event), zap.String("delivery", delivery))
	d, err := trigger.Gitea(s.Registry(), event, delivery, body, s.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.act(w, r, log, d)
}

func (s *Server) planeWebhook(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	if err := webhook.Verify(s.PlaneSecret, body, r.Header.Get("X-Plane-Signature")); err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"ignored": "plane triggers are not implemented yet"})
}

// act carries out a trigger decision and answers the webhook.
func (s *Server) act(w http.ResponseWriter, r *http.Request, log *zap.Logger, d trigger.Decision) {
	if d.Ignored != "" {
		log.Info("webhook ignored", zap.String("reason", d.Ignored))
		writeJSON(w, http.StatusOK, map[string]string{"ignored": d.Ignored})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), PublishTimeout)
	defer cancel()
	ans := Accepted{Jobs: []JobRef{}}
	for i := range d.Jobs {
		job := &d.Jobs[i]
		jlog := log.With(zap.String("job", job.ID))
		res, err := s.Queue.Enqueue(ctx, job)
		if err != nil {
			jlog.Error("queueing job", zap.Error(err))
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, "could not queue the job: JetStream unavailable")
			return
		}
		jlog.Info("job queued", zap.String("kind", string(job.Kind)), zap.String("project", job.Project),
			zap.String("task", job.Task.ID), zap.Bool("duplicate", res.Duplicate))
		ans.Jobs = append(ans.Jobs, JobRef{ID: job.ID, Kind: job.Kind, Project: job.Project, Task: job.Task.ID})
	}
	writeJSON(w, http.StatusAccepted, ans)
}
