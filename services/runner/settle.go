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

// settle records how the attempt ended and acks, retries, hands back or
// terminates the message. ctx may be the reason the job stopped: the
// outcome is still written, within AckWait.
func (r *Runner) settle(ctx context.Context, log *zap.Logger, msg jetstream.Msg, job *proto.Job, p *registry.Project, attempt int, out outcome) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
	defer cancel()
	res := out.res
	o := status.Outcome{
		Attempt: attempt, MaxAttempts: r.cfg.MaxAttempts, Runner: r.cfg.Name,
		FinishedAt: time.Now().UTC(), ExitCode: res.ExitCode,
	}
	if res.Err != nil {
		o.Err = res.Err.Error()
	}
	if c := out.claude; c != nil {
		o.Agent, o.CostUSD, o.Turns, o.SessionID = true, c.TotalCostUSD, c.NumTurns, c.SessionID
		o.Result = c.Result
	}
	r.shown(&o)
	// record applies t and reports whether it wrote; a refusal (the
	// record has moved on) is not retried.
	record := func(t func(status.Outcome) status.Transition) bool {
		tr := t(o)
		var refused bool
		err := retry(ctx, func() error {
			_, err := r.status.Apply(ctx, job, tr)
			if errors.Is(err, status.ErrTerminal) || errors.Is(err, status.ErrSuperseded) {
				refused = true
				return nil
			}
			return err
		})
		if err != nil {
			log.Warn("recording state", zap.String("transition", tr.Name), zap.Error(err))
			return false
		}
		return !refused
	}
	switch {
	case errors.Is(res.Err, errAlreadyDone):
		// A success redelivered (its ack was lost): finish what the first
		// settle may not have, the pipeline and the ack.
		log.Info("job already done: acking the redelivery")
		r.advance(ctx, log, job, p)
		if err := retry(ctx, func() error { return msg.DoubleAck(ctx) }); err != nil {
			log.Warn("ack", zap.Error(err))
		}
	case errors.Is(res.Err, errCancelled):
		r.recordCancelled(ctx, log, job, attempt, res)
		r.metrics.settled(job, out, outcomeCancelled)
		if err := msg.TermWithReason(proto.ReasonCancelled); err != nil {
			log.Warn("terminating cancelled job", zap.Error(err))
		}
		log.Info("job cancelled")
	case errors.Is(res.Err, errLeaseLost), errors.Is(res.Err, errLockLost), errors.Is(res.Err, errSuperseded):
		// JetStream has given or will give the job to another runner:
		// leave the message and the record to it.
		log.Warn("job lost to another runner: not settling it", zap.Error(res.Err))
		r.metrics.settled(job, out, outcomeLostLease)
	case errors.Is(res.Err, errShutdown):
		record(status.Requeue)
		r.metrics.settled(job, out, outcomeHandedBack)
		// Handed back at once: the attempt was not the job's fault.
		_ = msg.Nak()
		log.Warn("job stopped by shutdown: handed back", zap.Error(res.Err))
	case errors.Is(res.Err, agent.ErrPermissionDenied):
		// Denied tools, or Claude Code refusing to bypass permissions as
		// root: a retry would fail the same way, so fail the job now. Term
		// reaches the notifier as MSG_TERMINATED with a runner's reason,
		// which it alerts on and dead-letters like any failure.
		if !record(status.Fail) {
			log.Warn("agent lacks the permissions it needs, but the record has moved on: not terminating", zap.Error(res.Err))
			return
		}
		if err := retry(ctx, func() error { return msg.TermWithReason(proto.TermReason(job.ID, res.Err.Error())) }); err != nil {
			log.Warn("terminating job", zap.Error(err))
		}
		log.Error("agent lacks the permissions it needs: job failed without retries", zap.Error(res.Err))
	case res.Err == nil:
		if !record(status.Finish) {
			if st, _, err := r.status.Get(ctx, job.ID); err == nil && st.Attempt > attempt {
				log.Warn("job done, but a later delivery owns it now: not acking")
				r.metrics.settled(job, out, outcomeLostLease)
				return
			}
		}
		r.advance(ctx, log, job, p)
		if err := retry(ctx, func() error { return msg.DoubleAck(ctx) }); err != nil {
			log.Warn("ack", zap.Error(err))
		}
		log.Info("job done", zap.Duration("took", res.Duration), zap.Float64("cost_usd", costOf(out.claude)))
		r.metrics.settled(job, out, outcomeDone)
	case attempt < r.cfg.MaxAttempts:
		delay := RetryDelay(r.cfg.RetryDelay, r.cfg.RetryMaxDelay, attempt)
		record(status.Retry)
		r.metrics.settled(job, out, outcomeRetry)
		if err := msg.NakWithDelay(delay); err != nil {
			log.Warn("nak", zap.Error(err))
		}
		log.Warn("agent failed: will retry", zap.Error(res.Err), zap.Int("exit_code", res.ExitCode), zap.Duration("delay", delay))
	default:
		// The last attempt: JetStream's MAX_DELIVERIES advisory takes it
		// to the notifier, which alerts and dead-letters it.
		record(status.Fail)
		r.metrics.settled(job, out, outcomeFailed)
		_ = msg.Nak()
		log.Error("agent failed on its last attempt", zap.Error(res.Err), zap.Int("exit_code", res.ExitCode))
	}
}

// costOf is the cost the agent reported, 0 when it reported none.
func costOf(c *agent.ClaudeResult) float64 {
	if c == nil {
		return 0
	}
	return c.TotalCostUSD
}
