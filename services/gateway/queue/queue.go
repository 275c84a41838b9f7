// Package queue puts jobs on the JOBS stream. A job counts as queued only
// once JetStream has acked it, and each job is published at most once per
// dedupe key: JetStream's duplicate window catches quick repeats, the KV
// status record catches the rest.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/status"
)

// Queue publishes jobs.
type Queue struct {
	js     jetstream.JetStream
	status *status.Store
}

// New returns a Queue on js that records status in st.
func New(js jetstream.JetStream, st *status.Store) *Queue {
	return &Queue{js: js, status: st}
}

// Result says what Enqueue did with one job.
type Result struct {
	// Duplicate is set when the job was already known and not published.
	Duplicate bool
}

// Enqueue publishes job unless it is already known, and records it as
// queued. It returns only once JetStream holds the job.
func (q *Queue) Enqueue(ctx context.Context, job *proto.Job) (Result, error) {
	if _, _, err := q.status.Get(ctx, job.ID); err == nil {
		return Result{Duplicate: true}, nil
	} else if !errors.Is(err, status.ErrNotFound) {
		return Result{}, err
	}
	data, err := json.Marshal(job)
	if err != nil {
		return Result{}, fmt.Errorf("encoding job %s: %w", job.ID, err)
	}
	ack, err := q.js.Publish(ctx, proto.JobSubject(job.Project, job.Kind), data, jetstream.WithMsgID(job.ID))
	if err != nil {
		return Result{}, fmt.Errorf("publishing job %s: %w", job.ID, err)
	}
	// The runner may already have written a newer state; Create leaves it.
	if _, err := q.status.Create(ctx, &proto.Status{Job: *job, State: proto.StateQueued}); err != nil {
		return Result{}, err
	}
	return Result{Duplicate: ack.Duplicate}, nil
}
