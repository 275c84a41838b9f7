package runner

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
)

// settle decides what out, the outcome of delivery attempt of job, calls
// for (decide) and does it: it writes the record, then acks, retries,
// fails, terminates or hands back the message, or leaves both alone. ctx
// may be the reason the job stopped: the outcome is still written, within
// AckWait. p is nil for a job that cannot run.
func (r *Runner) settle(ctx context.Context, log *zap.Logger, msg jetstream.Msg, job *proto.Job, p *registry.Project, attempt int, out outcome) {
	v := decide(out, attempt, r.limits())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
	defer cancel()
	o := status.Outcome{
		Attempt: attempt, MaxAttempts: r.cfg.MaxAttempts, Runner: r.cfg.Name,
		FinishedAt: time.Now().UTC(), ExitCode: out.exitCode,
		Resumed: out.resumed, Restored: out.restored,
	}
	if out.err != nil {
		o.Err = out.err.Error()
	}
	if c := out.claude; c != nil {
		o.Agent, o.CostUSD, o.Turns, o.SessionID = true, c.TotalCostUSD, c.NumTurns, c.SessionID
		o.Result = c.Result
	}
	if out.spent > o.CostUSD {
		// Stopped before it reported: what was seen it spend.
		o.Agent, o.CostUSD = true, out.spent
	}
	// From here on only the scrubbed text is shown: in the record, the
	// Term reason (the notifier's alert) and the log.
	r.shown(&o)

	if out.end == usageLimited {
		r.pauseCredential(ctx, log, job, out)
	}
	if tr, ok := transition(v.record, o, out); ok {
		if st := r.record(ctx, log, job, tr); st != nil && st.Attempt > attempt {
			log.Warn("a later delivery owns the job now: leaving its message to it", zap.Stringer("verdict", v.do))
			r.metrics.settled(job, out, outcomeLostLease)
			return
		}
	}
	if o.Agent && o.CostUSD > 0 && v.do != leaveAlone {
		r.addSpend(ctx, log, job, attempt, o.CostUSD)
	}
	fields := []zap.Field{zap.Stringer("ending", out.end)}
	if o.Err != "" {
		fields = append(fields, zap.String("error", o.Err))
	}
	if out.end == ranToEnd || out.end == notPrepared {
		fields = append(fields, zap.Int("exit_code", out.exitCode))
	}
	var err error
	switch v.do {
	case ack:
		if p != nil {
			r.advance(ctx, log, job, p)
		}
		err = retry(ctx, func() error { return msg.DoubleAck(ctx) })
		if v.record == writeFinish {
			fields = append(fields, zap.Duration("took", out.took), zap.Float64("cost_usd", costOf(out.claude)))
		}
	case retryAfter:
		delay := spread(v.delay, r.cfg.RetryMaxDelay)
		err = retry(ctx, func() error { return msg.NakWithDelay(delay) })
		fields = append(fields, zap.Duration("delay", delay))
	case fail, handBack:
		err = retry(ctx, func() error { return msg.Nak() })
	case terminate:
		reason := v.reason
		if reason == "" {
			reason = proto.TermReason(job.ID, o.Err)
		}
		err = retry(ctx, func() error { return msg.TermWithReason(reason) })
	case holdBack:
		err = retry(ctx, func() error { return msg.DoubleAck(ctx) })
		fields = append(fields, zap.String("reason", out.holdReason))
		if !out.holdUntil.IsZero() {
			fields = append(fields, zap.Time("held_until", out.holdUntil))
		}
	case leaveAlone:
	}
	if err != nil {
		log.Warn("settling the message", zap.Stringer("verdict", v.do), zap.Error(err))
	}
	if v.count != "" {
		r.metrics.settled(job, out, v.count)
	}
	log.Log(v.level, v.note, fields...)
}

// limits are the runner's settings that verdicts depend on.
func (r *Runner) limits() limits {
	return limits{maxAttempts: r.cfg.MaxAttempts, retryDelay: r.cfg.RetryDelay, retryMaxDelay: r.cfg.RetryMaxDelay}
}

// transition is the lifecycle transition w records for o, of the
// delivery that ended in out; ok is false for writeNothing.
func transition(w write, o status.Outcome, out outcome) (t status.Transition, ok bool) {
	switch w {
	case writeHold:
		return status.Hold(o.Attempt, o.Runner, out.holdReason, out.holdUntil, o.FinishedAt), true
	case writeFinish:
		return status.Finish(o), true
	case writeRetry:
		return status.Retry(o), true
	case writeFail:
		return status.Fail(o), true
	case writeRequeue:
		return status.Requeue(o), true
	case writeReject:
		return status.Reject(o.Attempt, o.MaxAttempts, o.Runner, o.Err, o.FinishedAt), true
	case writeStopped:
		return status.Stopped(o.Attempt, o.Runner, o.ExitCode, o.FinishedAt), true
	}
	return status.Transition{}, false
}

// record applies t to job's record, trying again while NATS fails, and
// returns the record as it is when the lifecycle refused t (the record
// has moved on), else nil. A refusal is not retried.
func (r *Runner) record(ctx context.Context, log *zap.Logger, job *proto.Job, t status.Transition) (movedOn *proto.Status) {
	err := retry(ctx, func() error {
		st, err := r.status.Apply(ctx, job, t)
		if errors.Is(err, status.ErrTerminal) || errors.Is(err, status.ErrSuperseded) || errors.Is(err, status.ErrNotCancelled) {
			movedOn = st
			return nil
		}
		return err
	})
	if err != nil {
		log.Warn("recording state", zap.String("transition", t.Name), zap.Error(err))
	}
	return movedOn
}

// costOf is the cost the agent reported, 0 when it reported none.
func costOf(c *agent.ClaudeResult) float64 {
	if c == nil {
		return 0
	}
	return c.TotalCostUSD
}
