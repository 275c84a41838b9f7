package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// advance queues the next kind of the project's pipeline for the same
// task. The next job's id is derived from this job's id, so a redelivered
// success names the same job: JetStream's duplicate window drops a second
// publish, and past it the existing status record does.
func (r *Runner) advance(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project) {
	next := proto.Kind(p.Pipeline[string(job.Kind)])
	if next == "" {
		return
	}
	nj := proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID("pipeline|" + job.ID + "|" + string(next)),
		Kind: next, Project: job.Project, Task: job.Task, CreatedAt: time.Now().UTC(),
		Source: proto.Source{System: "runner", Event: "pipeline", Delivery: job.ID, Actor: r.cfg.Name},
	}
	log = log.With(zap.String("next_job", nj.ID), zap.String("next_kind", string(next)))
	err := retry(ctx, func() error {
		if _, _, err := r.status.Get(ctx, nj.ID); err == nil {
			return nil // queued before
		} else if !errors.Is(err, status.ErrNotFound) {
			return err
		}
		data, err := json.Marshal(nj)
		if err != nil {
			return err
		}
		if _, err := r.js.Publish(ctx, proto.JobSubject(nj.Project, nj.Kind), data, jetstream.WithMsgID(nj.ID)); err != nil {
			return fmt.Errorf("publishing job %s: %w", nj.ID, err)
		}
		// A runner may already have picked it up: Queue leaves its state.
		if _, err := r.status.Apply(ctx, &nj, status.Queue(r.cfg.MaxAttempts)); err != nil && !errors.Is(err, status.ErrExists) {
			return err
		}
		return nil
	})
	if err != nil {
		log.Error("pipeline: queuing the next job failed", zap.Error(err))
		return
	}
	log.Info("pipeline: next job queued")
}
