package queue

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
)

// Timing of RecordWaiting.
const (
	// RecordAfterDefault is how long a job may wait in JOBS without a
	// status record before the gateway creates its record as queued.
	RecordAfterDefault = time.Second
	// recordEvery is how often the waiting jobs are looked at.
	recordEvery = 250 * time.Millisecond
	// recordWriters bounds the records written at once.
	recordWriters = 16
)

// RecordWaiting creates, until ctx ends, the status record (queued) of
// every job that has waited Config.RecordAfter in JOBS without one: no runner
// took it at once (all busy, or none running). A job a runner takes
// sooner costs its webhook one durable write, the publish, and the runner
// creates its record; a job that waits gets its record from here, so the
// notifier, which follows the records, sees it queued (the Gitea commit
// status, a Plane agent run's first thought, the comment of a job queued
// too long) and `nats kv get` finds it. Every gateway does this for
// every waiting job it knows; the record is a create, so the first one
// stands.
func (q *Queue) RecordWaiting(ctx context.Context, log *zap.Logger) {
	tick := time.NewTicker(recordEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, err := q.ready()
		if err != nil {
			continue
		}
		var (
			wg       sync.WaitGroup
			sem      = make(chan struct{}, recordWriters)
			mu       sync.Mutex
			failedID string
			failed   error
		)
		for id := range q.tasks.WaitingFor(q.cfg.RecordAfter) {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := q.recordQueued(ctx, c, id); err != nil {
					mu.Lock()
					failedID, failed = id, err
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if failed != nil && ctx.Err() == nil {
			// One line a pass, naming one of the jobs: NATS away fails
			// them all alike.
			log.Warn("creating the status record of a waiting job, will retry", zap.String("job", failedID), zap.Error(failed))
		}
	}
}

// recordQueued creates the queued record of job id, which JOBS holds
// without one, unless a record was written meanwhile.
func (q *Queue) recordQueued(ctx context.Context, c *conn, id string) error {
	st, rev, err := q.current(ctx, c, id)
	if err != nil || rev != 0 {
		return err // a record exists: nothing to do
	}
	_, err = c.status.ApplyFrom(ctx, &st.Job, st, 0, status.Queue(0))
	if errors.Is(err, status.ErrExists) {
		return nil
	}
	return err
}
