package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// consume is the runner's intake: it pulls jobs, no more at once than
// MaxConcurrency, and hands each to handle on its own goroutine, until ctx
// ends; then it gives back what is buffered and waits up to ShutdownGrace
// for the jobs in hand before stopping their agents.
func (r *Runner) consume(ctx context.Context, cons jetstream.Consumer) error {
	// Agents run under their own context: the first ctx end only stops
	// intake, and the grace period decides when they are stopped.
	agentCtx, stopAgents := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopAgents(nil)

	var wg sync.WaitGroup
	slots := make(chan struct{}, r.cfg.MaxConcurrency)
	draining := make(chan struct{})

	// The Consume handler is called serially: it waits for a free slot,
	// then hands the message to a worker. With MaxAckPending equal to the
	// slots, a buffered message never waits long for one.
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		select {
		case <-draining:
			// Delivered while shutting down: give it straight back.
			_ = msg.Nak()
			return
		case slots <- struct{}{}:
		}
		wg.Go(func() {
			p := r.handle(agentCtx, msg)
			<-slots
			// The project's spare worktree for its next new task is made
			// off the path of this job and of the next: the slot is free
			// while it waits for the clone's lock and runs git (a no-op
			// while the spare is current).
			if p != nil {
				r.makeSpare(agentCtx, p)
			}
		})
	},
		jetstream.PullMaxMessages(r.cfg.MaxConcurrency),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			r.log.Debug("consume", zap.Error(err))
		}),
	)
	if err != nil {
		return fmt.Errorf("consuming: %w", err)
	}
	r.metrics.bound.Store(true)
	r.log.Info("runner started", zap.String("runner", r.cfg.Name), zap.Int("max_concurrency", r.cfg.MaxConcurrency),
		zap.Int("max_attempts", r.cfg.MaxAttempts), zap.Strings("agent", r.argv), zap.String("workspace", r.cfg.WorkspaceDir))

	<-ctx.Done()
	r.metrics.bound.Store(false)
	r.log.Info("runner stopping: no new jobs", zap.Duration("grace", r.cfg.ShutdownGrace))
	close(draining)
	// Drain hands messages already buffered in the client to the handler,
	// which gives them back, instead of leaving them locked until AckWait.
	cc.Drain()
	<-cc.Closed()

	idle := make(chan struct{})
	go func() { wg.Wait(); close(idle) }()
	select {
	case <-idle:
	case <-time.After(r.cfg.ShutdownGrace):
		r.log.Warn("grace period over: stopping running agents")
		stopAgents(errShutdown)
		<-idle
	}
	r.log.Info("runner stopped")
	return nil
}
