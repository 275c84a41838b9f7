package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/status"
	"github.com/orch-dev/orch/services/gateway/trigger"
)

// MaxRequestBytes bounds the body of POST /jobs.
const MaxRequestBytes = 1 << 20

// EnqueueRequest is the body of POST /jobs.
type EnqueueRequest struct {
	Project string     `json:"project"`
	Kind    proto.Kind `json:"kind"`
	Task    proto.Task `json:"task"`
	// Trigger is the instruction for the agent, if any.
	Trigger string `json:"trigger,omitempty"`
	// Key, when given, makes the request idempotent: the same key names
	// the same job. Without it every request makes a new job.
	Key string `json:"key,omitempty"`
	// Actor is who asked, for the record.
	Actor string `json:"actor,omitempty"`
}

// JobChange is the answer of cancel and retry.
type JobChange struct {
	Job   JobRef      `json:"job"`
	State proto.State `json:"state"`
	// RetryOf names the dead-lettered job a retry re-runs.
	RetryOf string `json:"retry_of,omitempty"`
}

func (s *Server) enqueue(w http.ResponseWriter, r *http.Request) {
	var req EnqueueRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, MaxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "decoding request: "+err.Error())
		return
	}
	p, ok := s.Registry().ByKey(req.Project)
	if !ok {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown project %q", req.Project))
		return
	}
	if !req.Kind.Valid() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown kind %q", req.Kind))
		return
	}
	if req.Task.ID == "" {
		writeError(w, http.StatusBadRequest, "task.id is required")
		return
	}
	key := req.Key
	if key == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		key = hex.EncodeToString(b[:])
	}
	req.Task.ID = trigger.TaskID(req.Task.ID)
	job := proto.Job{
		Schema:    proto.SchemaVersion,
		ID:        proto.JobID(p.Key + "|" + string(req.Kind) + "|api|" + key),
		Kind:      req.Kind,
		Project:   p.Key,
		Task:      req.Task,
		Source:    proto.Source{System: "api", Event: "enqueue", Actor: req.Actor},
		CreatedAt: s.nowUTC(),
		Trigger:   req.Trigger,
	}
	s.queueOne(w, r, &job)
}

// queueOne publishes a job for a write endpoint. Unlike a webhook, the
// caller can try again, so nothing is spooled: 503 when JetStream is away.
func (s *Server) queueOne(w http.ResponseWriter, r *http.Request, job *proto.Job) {
	log := logFrom(r).With(zap.String("job", job.ID))
	if err := job.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	res, err := s.Queue.Enqueue(r.Context(), job)
	if err != nil {
		log.Warn("queueing job", zap.Error(err))
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "could not queue the job: JetStream unavailable")
		return
	}
	log.Info("job queued by hand", zap.String("kind", string(job.Kind)), zap.String("project", job.Project),
		zap.String("task", job.Task.ID), zap.String("retry_of", job.RetryOf), zap.Bool("duplicate", res.Duplicate))
	ref := refOf(job)
	ref.Duplicate = res.Duplicate
	writeJSON(w, http.StatusAccepted, Accepted{Jobs: []JobRef{ref}})
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	id, ok := jobID(w, r)
	if !ok {
		return
	}
	log := logFrom(r).With(zap.String("job", id))
	st, err := s.Queue.Cancel(r.Context(), id)
	switch {
	case errors.Is(err, status.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such job")
	case errors.Is(err, status.ErrTerminal):
		writeError(w, http.StatusConflict, fmt.Sprintf("job has already ended: %s", st.State))
	case err != nil:
		log.Warn("cancelling job", zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "could not cancel the job: JetStream unavailable")
	default:
		log.Info("job cancelled by hand")
		writeJSON(w, http.StatusOK, JobChange{Job: refOf(&st.Job), State: st.State})
	}
}

// retry re-queues a dead-lettered job as a fresh job linked to it. The new
// id follows from the old id and its place in JOBS_DLQ, so retrying the
// same dead letter twice names the same job.
func (s *Server) retry(w http.ResponseWriter, r *http.Request) {
	id, ok := jobID(w, r)
	if !ok {
		return
	}
	b, ok := s.status(w)
	if !ok {
		return
	}
	log := logFrom(r).With(zap.String("job", id))
	st, _, err := b.status.Get(r.Context(), id)
	if errors.Is(err, status.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no such job")
		return
	}
	if err != nil {
		log.Warn("reading job", zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "status store unavailable")
		return
	}
	if st.DLQSeq == 0 {
		writeError(w, http.StatusConflict, fmt.Sprintf("job is not dead-lettered (state %s)", st.State))
		return
	}
	raw, err := deadLetter(r.Context(), b.js, st.DLQSeq)
	if err != nil {
		log.Warn("reading dead letter", zap.Uint64("dlq_seq", st.DLQSeq), zap.Error(err))
		writeError(w, http.StatusConflict, "the dead letter is no longer in "+proto.StreamDLQ)
		return
	}
	old, err := proto.DecodeJob(raw)
	if err != nil || old.ID != id {
		writeError(w, http.StatusConflict, "the dead letter does not hold this job")
		return
	}
	job := *old
	job.Schema = proto.SchemaVersion
	job.ID = proto.JobID("retry|" + old.ID + "|" + strconv.FormatUint(st.DLQSeq, 10))
	job.RetryOf = old.ID
	job.Source = proto.Source{System: "api", Event: "retry", Actor: old.Source.Actor}
	job.CreatedAt = s.nowUTC()
	s.queueOne(w, r, &job)
}

// deadLetter reads the job at seq in JOBS_DLQ.
func deadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) ([]byte, error) {
	dlq, err := js.Stream(ctx, proto.StreamDLQ)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", proto.StreamDLQ, err)
	}
	msg, err := dlq.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("reading %s #%d: %w", proto.StreamDLQ, seq, err)
	}
	return msg.Data, nil
}
