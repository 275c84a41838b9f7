package runner

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/logstream"
)

// ProgressInterval is the least time between two progress updates of a
// running job's status record: often enough to watch, rare enough that a
// chatty agent does not turn into a stream of KV writes.
const ProgressInterval = 3 * time.Second

// LogDrainTimeout bounds how long a finished attempt waits for its last
// output to reach JetStream before the job is settled anyway.
const LogDrainTimeout = 10 * time.Second

// runAgent runs the agent while its output is published to JOBS_LOGS and
// its progress recorded, then publishes the rest of its output. The
// runner drains the agent's output pipe into its log file, which the
// publisher follows, so an outage never holds the agent up (packages
// agent and logstream). An agent whose output shows it spent more than
// capUSD (0: no cap), or more turns than maxTurns, is stopped with
// errOverBudget or errMaxTurns (watchSpend); spent is
// what its output showed spent. The error is the publisher's: no agent
// ran.
func (r *Runner) runAgent(ctx context.Context, log *zap.Logger, job *proto.Job, attempt int, spec agent.Spec, capUSD float64, maxTurns int) (_ agent.Result, spent float64, _ error) {
	// A file left by an earlier run on this host would be read as this
	// attempt's output before the agent's run truncates it.
	_ = os.Remove(spec.LogPath)
	pub, err := logstream.Start(logstream.Config{
		JS: r.js, Log: log, JobID: job.ID, Attempt: attempt, Path: spec.LogPath,
		MaxPayload: r.nc.MaxPayload(), BufferBytes: int(r.cfg.LogBuffer), Price: r.price,
	})
	if err != nil {
		return agent.Result{}, 0, err
	}
	spec.Drained = pub.Wake
	progCtx, stopProgress := context.WithCancel(context.WithoutCancel(ctx))
	progDone := make(chan struct{})
	go func() {
		defer close(progDone)
		r.recordProgress(progCtx, log, job, attempt, pub)
	}()
	ctx, overBudget := context.WithCancelCause(ctx)
	defer overBudget(nil)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		watchSpend(progCtx, pub, func() float64 { return r.meteredSpend(job.ID) }, capUSD, maxTurns, overBudget)
	}()

	// agent.Run says whether the agent ended before ctx did: a stopped
	// agent's result is the cause of the stop, whatever its exit status.
	// One that ended first keeps its result even if the lease is lost
	// later, while its output is drained: settling it is guarded by the
	// record (see settle), so a later delivery that owns the job wins, and
	// one that comes after finds the job done instead of running it again.
	res := r.runAgentTimed(ctx, job, spec)
	stopProgress()
	<-progDone
	<-watchDone
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), LogDrainTimeout)
	st := pub.Close(dctx)
	cancel()
	fields := []zap.Field{zap.Int64("bytes", st.Bytes), zap.Int("messages", st.Messages)}
	switch {
	case !st.Ended:
		log.Warn("agent output not fully published", append(fields, zap.Int("unpublished", st.Unpublished))...)
	case st.DroppedBytes > 0:
		log.Warn("agent output partly dropped while JetStream was away", append(fields, zap.Int64("dropped_bytes", st.DroppedBytes))...)
	default:
		log.Debug("agent output published", fields...)
	}
	prog, _ := pub.Progress()
	return res, max(prog.SpentUSD, r.meteredSpend(job.ID)), nil
}

// recordProgress writes the publisher's progress into the job's record
// every ProgressInterval while it changes, as long as the record shows
// this attempt running.
func (r *Runner) recordProgress(ctx context.Context, log *zap.Logger, job *proto.Job, attempt int, pub *logstream.Publisher) {
	t := time.NewTicker(ProgressInterval)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		prog, activity := pub.Progress()
		if activity.Equal(last) {
			continue
		}
		last = activity
		_, err := r.status.Apply(ctx, job, status.Progress(attempt, func(st *proto.Status) {
			st.Turns, st.CostUSD, st.LastActivity = prog.Turns, prog.CostUSD, activity.UTC()
		}))
		if err != nil && ctx.Err() == nil {
			log.Debug("recording progress", zap.Error(err))
		}
	}
}

// dropLocalLog removes the attempt's log file when ORCH_LOG_LOCAL is
// off: the stream has the output; the file served the attempt's own
// reading of the agent's result.
func (r *Runner) dropLocalLog(log *zap.Logger, path string) {
	if *r.cfg.LogLocal || path == "" {
		return
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		log.Warn("removing local agent log", zap.Error(err))
	}
}
