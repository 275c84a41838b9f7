package runner

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// runningWrite is the write of a job's running state, under way beside
// the job's preparation and its agent's start (see run).
type runningWrite struct {
	done chan struct{}
	// out is the job's outcome when the record said it is not to run
	// (refuses); both are set before done is closed.
	out     outcome
	refuses bool
}

// writeRunning writes the running state of attempt over rec, the record
// as read when the job began. When the record has changed since to say
// the job is not to run, it calls stop, which ends the job's preparation
// or agent.
func (r *Runner) writeRunning(ctx context.Context, log *zap.Logger, job *proto.Job, rec record, attempt int, logField string, stop context.CancelCauseFunc) *runningWrite {
	w := &runningWrite{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		if testHookBeforeRunningWrite != nil {
			testHookBeforeRunningWrite(job.ID)
		}
		st, err := r.status.ApplyFrom(ctx, job, rec.st, rec.rev,
			status.StartAttempt(attempt, r.cfg.MaxAttempts, r.cfg.Name, logField, time.Now().UTC()).With(r.conf.record))
		switch {
		case errors.Is(err, status.ErrTerminal) && st.State == proto.StateCancelled:
			w.out, w.refuses = outcome{end: cancelled, exitCode: -1}, true
		case errors.Is(err, status.ErrTerminal) && st.State == proto.StateDone:
			w.out, w.refuses = outcome{end: alreadyDone}, true
		case errors.Is(err, status.ErrTerminal), errors.Is(err, status.ErrSuperseded):
			w.out, w.refuses = outcome{end: superseded, exitCode: -1}, true
		case err != nil && ctx.Err() == nil:
			// Status is bookkeeping: a KV hiccup does not stop the job.
			log.Warn("recording running state", zap.Error(err))
		}
		if w.refuses {
			stop(errNotToRun)
			return
		}
		r.metrics.started(job, attempt)
	}()
	return w
}

// testHookBeforeRunningWrite, set by tests only, runs before the
// running state's write: a test makes the write come after the agent's
// start with it, which it does not wait for.
var testHookBeforeRunningWrite func(jobID string)

// refused waits for the write and returns the outcome the record called
// for, with true, when it said the job is not to run.
func (w *runningWrite) refused() (outcome, bool) {
	<-w.done
	return w.out, w.refuses
}

// errNotToRun stops a job whose record, as its running state was
// written, said it is not to run: its ending is the record's (see
// runningWrite), whatever the stopped agent returned.
var errNotToRun = errors.New("the record says the job is not to run")
