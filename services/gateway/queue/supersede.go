package queue

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// supersedes reports whether job may supersede older jobs that the index
// names (see supersede): most jobs have none, and cost nothing more.
func (q *Queue) supersedes(job *proto.Job) bool {
	return job.Kind != proto.KindRespond && job.Kind != proto.KindCleanup && q.tasks.Synced() &&
		len(q.tasks.OlderOpenJobs(job.Project, job.Task.ID, job.Kind, job.CreatedAt)) > 0
}

// supersede cancels, with proto.ReasonSuperseded naming job, the older
// open jobs of job's task and kind: three pushes to a pull request within
// a minute queue three reviews, and only the newest is worth paying for.
// A waiting job (queued, held, retrying) is superseded, its record
// created if it has none yet; a running one only where the project says
// supersede: running (its runner stops the agent, as for a cancel).
// Respond jobs each answer their own mention and a cleanup costs nothing,
// so neither supersedes (supersedes). Superseding is a saving, not a
// guarantee: an error is logged and the older job runs.
func (q *Queue) supersede(c *conn, job *proto.Job) {
	ctx, cancel := context.WithTimeout(context.Background(), supersedeTimeout)
	defer cancel()
	running := q.cfg.SupersedeRunning != nil && q.cfg.SupersedeRunning(job.Project)
	// The index names the candidates; each is read again, since the index
	// may be a write behind, and written from what was read (no second
	// read, unless another writer came first).
	for _, id := range q.tasks.OlderOpenJobs(job.Project, job.Task.ID, job.Kind, job.CreatedAt) {
		st, rev, err := q.current(ctx, c, id)
		if err != nil {
			continue
		}
		if st.Job.Kind != job.Kind || !st.Job.CreatedAt.Before(job.CreatedAt) {
			continue
		}
		if st.State == proto.StateRunning && !running {
			continue
		}
		// Written only if still so: a job that started meanwhile is
		// refused (ErrRunning) unless running ones may be superseded.
		was := cmp.Or(st.State, proto.StateQueued)
		_, err = c.status.ApplyFrom(ctx, &st.Job, st, rev, status.Supersede(job.ID, running))
		fields := []zap.Field{zap.String("job", job.ID), zap.String("project", job.Project), zap.String("task", job.Task.ID), zap.String("older_job", id)}
		switch {
		case errors.Is(err, status.ErrTerminal), errors.Is(err, status.ErrNotFound), errors.Is(err, status.ErrRunning):
		case err != nil:
			q.log.Warn("superseding an older job", append(fields, zap.Error(err))...)
		default:
			q.log.Info("older job superseded", append(fields, zap.String("was", string(was)))...)
		}
	}
}

// supersedeTimeout bounds a job's supersede.
const supersedeTimeout = 10 * time.Second
