package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/trigger"
)

// Request asks for a job by hand (POST /jobs).
type Request struct {
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

// Change is what cancel and retry did.
type Change struct {
	Job   Ref         `json:"job"`
	State proto.State `json:"state"`
	// RetryOf names the dead-lettered job a retry re-runs.
	RetryOf string `json:"retry_of,omitempty"`
}

// Enqueue queues the job req asks for, refusing (400) an unknown project
// or kind and a request without a task.
func (s *Service) Enqueue(ctx context.Context, req Request) (Ref, error) {
	p, ok := s.cfg.Registry().ByKey(req.Project)
	if !ok {
		return Ref{}, refuse(http.StatusBadRequest, "unknown project %q", req.Project)
	}
	if !req.Kind.Valid() {
		return Ref{}, refuse(http.StatusBadRequest, "unknown kind %q", req.Kind)
	}
	if req.Task.ID == "" {
		return Ref{}, refuse(http.StatusBadRequest, "task.id is required")
	}
	key := req.Key
	if key == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		key = hex.EncodeToString(b[:])
	}
	req.Task.ID = trigger.TaskID(req.Task.ID)
	job := proto.Job{
		Schema:  proto.SchemaVersion,
		ID:      proto.JobID(p.Key + "|" + string(req.Kind) + "|api|" + key),
		Kind:    req.Kind,
		Project: p.Key,
		Task:    req.Task,
		// The token's holder wrote the task and the trigger: the operator,
		// whom the project trusts.
		Source:    proto.Source{System: "api", Event: "enqueue", Actor: req.Actor, Trusted: true},
		CreatedAt: s.nowUTC(),
		Trigger:   req.Trigger,
	}
	ref := RefOf(&job)
	dup, err := s.publishOne(ctx, &job)
	ref.Duplicate = dup
	return ref, err
}

// Cancel marks a queued or running job cancelled; the runner holding it
// stops its agent.
func (s *Service) Cancel(ctx context.Context, id string) (*Change, error) {
	if id == "" || proto.Token(id) != id {
		return nil, refuse(http.StatusNotFound, "no such job")
	}
	log := s.log(ctx).With(zap.String("job", id))
	st, err := s.cfg.Queue.Cancel(ctx, id)
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
	return &Change{Job: RefOf(&st.Job), State: st.State}, nil
}

// Release runs a held job now, whatever holds it (its budget, a pause):
// it is published again and its record says queued and who released it,
// so the runner that pulls it starts it. by names who asked.
func (s *Service) Release(ctx context.Context, id, by string) (*Change, error) {
	if id == "" || proto.Token(id) != id {
		return nil, refuse(http.StatusNotFound, "no such job")
	}
	c, err := s.connected()
	if err != nil {
		return nil, err
	}
	log := s.log(ctx).With(zap.String("job", id))
	st, err := c.status.ReleaseHeld(ctx, id, by, status.PublishTo(c.js))
	switch {
	case errors.Is(err, status.ErrNotFound):
		return nil, refuse(http.StatusNotFound, "no such job")
	case errors.Is(err, status.ErrNotHeld):
		return nil, refuse(http.StatusConflict, "job is not held: %s", st.State)
	case err != nil:
		log.Warn("releasing job", zap.Error(err))
		return nil, refuse(http.StatusServiceUnavailable, "could not release the job: JetStream unavailable")
	}
	log.Info("held job released by hand", zap.String("by", by), zap.String("was_held", st.HeldReason))
	return &Change{Job: RefOf(&st.Job), State: st.State}, nil
}

// Retry re-queues a dead-lettered job as a fresh job linked to it. The new
// id follows from the old id and its place in JOBS_DLQ, so retrying the
// same dead letter twice names the same job.
func (s *Service) Retry(ctx context.Context, id string) (*Change, error) {
	st, err := s.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	log := s.log(ctx).With(zap.String("job", id))
	if st.DLQSeq == 0 {
		return nil, refuse(http.StatusConflict, "job is not dead-lettered (state %s)", st.State)
	}
	c, err := s.connected()
	if err != nil {
		return nil, err
	}
	raw, _, err := deadLetter(ctx, c.js, st.DLQSeq)
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
	// The trigger's words are still the first job's: so is their trust.
	job.Source = proto.Source{System: "api", Event: "retry", Actor: old.Source.Actor, Trusted: old.Source.Trusted}
	job.CreatedAt = s.nowUTC()
	ref := RefOf(&job)
	dup, err := s.publishOne(ctx, &job)
	if err != nil {
		return nil, err
	}
	ref.Duplicate = dup
	return &Change{Job: ref, State: proto.StateQueued, RetryOf: old.ID}, nil
}

// publishOne publishes a job for a person's request. Unlike a webhook, the
// person can try again, so nothing is spooled: 503 when JetStream is away.
// It reports whether the job already existed (the same request again).
func (s *Service) publishOne(ctx context.Context, job *proto.Job) (duplicate bool, err error) {
	log := s.log(ctx).With(zap.String("job", job.ID))
	if err := job.Validate(); err != nil {
		return false, refuse(http.StatusBadRequest, "%s", err.Error())
	}
	res, err := s.cfg.Queue.Enqueue(ctx, job)
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
