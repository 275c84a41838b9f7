package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// Refusal is an action the gateway did not carry out, with the HTTP status
// that says why and a message for a person. The JSON API and the dashboard
// both show it as it is.
type Refusal struct {
	Code int
	Msg  string
}

func (e *Refusal) Error() string { return e.Msg }

func refuse(code int, format string, args ...any) error {
	return &Refusal{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// writeActionError answers a Refusal with its status, anything else 503.
func writeActionError(w http.ResponseWriter, err error) {
	var ref *Refusal
	if !errors.As(err, &ref) {
		ref = &Refusal{Code: http.StatusServiceUnavailable, Msg: err.Error()}
	}
	if ref.Code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	writeError(w, ref.Code, ref.Msg)
}

// Status returns the job's status record: a 404 Refusal for an unknown
// job, 503 while the status store is unreachable.
func (s *Server) Status(ctx context.Context, id string) (*proto.Status, error) {
	b := s.backend.Load()
	if b == nil {
		return nil, refuse(http.StatusServiceUnavailable, "status store unavailable: not connected to NATS yet")
	}
	if id == "" || proto.Token(id) != id {
		return nil, refuse(http.StatusNotFound, "no such job")
	}
	st, _, err := b.status.Get(ctx, id)
	if errors.Is(err, status.ErrNotFound) {
		return nil, refuse(http.StatusNotFound, "no such job")
	}
	if err != nil {
		logFromContext(ctx).Warn("reading job", zap.String("job", id), zap.Error(err))
		return nil, refuse(http.StatusServiceUnavailable, "status store unavailable")
	}
	return st, nil
}

// Cancel marks a queued or running job cancelled; the runner holding it
// stops its agent. POST /jobs/{id}/cancel and the dashboard both call it.
func (s *Server) Cancel(ctx context.Context, id string) (*JobChange, error) {
	log := logFromContext(ctx).With(zap.String("job", id))
	st, err := s.Queue.Cancel(ctx, id)
	switch {
	case errors.Is(err, status.ErrNotFound):
		return nil, refuse(http.StatusNotFound, "no such job")
	case errors.Is(err, status.ErrTerminal):
		return nil, refuse(http.StatusConflict, "job has already ended: %s", st.State)
	case err != nil:
		log.Warn("cancelling job", zap.Error(err))
		return nil, refuse(http.StatusServiceUnavailable, "could not cancel the job: JetStream unavailable")
	}
	log.Info("job cancelled by hand")
	return &JobChange{Job: refOf(&st.Job), State: st.State}, nil
}

// Retry re-queues a dead-lettered job as a fresh job linked to it. The new
// id follows from the old id and its place in JOBS_DLQ, so retrying the
// same dead letter twice names the same job. POST /jobs/{id}/retry and the
// dashboard both call it.
func (s *Server) Retry(ctx context.Context, id string) (*JobChange, error) {
	st, err := s.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	log := logFromContext(ctx).With(zap.String("job", id))
	if st.DLQSeq == 0 {
		return nil, refuse(http.StatusConflict, "job is not dead-lettered (state %s)", st.State)
	}
	b := s.backend.Load()
	raw, _, err := deadLetter(ctx, b.js, st.DLQSeq)
	if err != nil {
		log.Warn("reading dead letter", zap.Uint64("dlq_seq", st.DLQSeq), zap.Error(err))
		return nil, refuse(http.StatusConflict, "the dead letter is no longer in %s", proto.StreamDLQ)
	}
	old, err := proto.DecodeJob(raw)
	if err != nil || old.ID != id {
		return nil, refuse(http.StatusConflict, "the dead letter does not hold this job")
	}
	job := *old
	job.Schema = proto.SchemaVersion
	job.ID = proto.JobID("retry|" + old.ID + "|" + strconv.FormatUint(st.DLQSeq, 10))
	job.RetryOf = old.ID
	job.Source = proto.Source{System: "api", Event: "retry", Actor: old.Source.Actor}
	job.CreatedAt = s.nowUTC()
	ref := refOf(&job)
	dup, err := s.publishOne(ctx, &job)
	if err != nil {
		return nil, err
	}
	ref.Duplicate = dup
	return &JobChange{Job: ref, State: proto.StateQueued, RetryOf: old.ID}, nil
}

// publishOne publishes a job for a person's request. Unlike a webhook, the
// person can try again, so nothing is spooled: 503 when JetStream is away.
// It reports whether the job already existed (the same request again).
func (s *Server) publishOne(ctx context.Context, job *proto.Job) (duplicate bool, err error) {
	log := logFromContext(ctx).With(zap.String("job", job.ID))
	if err := job.Validate(); err != nil {
		return false, refuse(http.StatusBadRequest, "%s", err.Error())
	}
	res, err := s.Queue.Enqueue(ctx, job)
	if err != nil {
		log.Warn("queueing job", zap.Error(err))
		return false, refuse(http.StatusServiceUnavailable, "could not queue the job: JetStream unavailable")
	}
	log.Info("job queued by hand", zap.String("kind", string(job.Kind)), zap.String("project", job.Project),
		zap.String("task", job.Task.ID), zap.String("retry_of", job.RetryOf), zap.Bool("duplicate", res.Duplicate))
	return res.Duplicate, nil
}

// deadLetter reads the message at seq in JOBS_DLQ: the job and its headers.
func deadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) ([]byte, map[string][]string, error) {
	dlq, err := js.Stream(ctx, proto.StreamDLQ)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", proto.StreamDLQ, err)
	}
	msg, err := dlq.GetMsg(ctx, seq)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s #%d: %w", proto.StreamDLQ, seq, err)
	}
	return msg.Data, msg.Header, nil
}
