package runner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// The heartbeat is a lease.
//
// Every AckWait/3 the runner tells JetStream the job is in progress. That
// message is fire-and-forget (the client buffers it while disconnected and
// reports no error), so each beat is confirmed: a flush round trip to the
// server, and, once the task lock is held, a compare-and-set refresh of the
// lock, which only JetStream can answer. A runner that has had no
// confirmed beat for leaseTimeout (2/3 of AckWait) must assume JetStream
// will hand the job to another runner when AckWait runs out, and stops its
// agent with errLeaseLost, within the remaining third of AckWait (the kill
// grace should be shorter than that). So neither MaxAckPending nor "one
// agent per task" breaks across a NATS outage or a partition.
//
// The lease runs from the moment the last confirmed beat was sent, not
// from when its answer came: JetStream received the InProgress and stamped
// the lock's refresh after that moment, so the lease ends no later than
// leaseTimeout after the revision a waiting runner judges the lock by (see
// lock.go). It ends on a timer of its own, not at the next tick. A beat
// waits for its answer until the lease's end and never past it: on a
// loaded machine an answer is late far more often than lost, and a beat
// abandoned early only to be sent again would not arrive sooner.

// errLeaseLost is the cause of a job stopped because its heartbeat could
// not be confirmed for too long.
var errLeaseLost = errors.New("lease lost: no confirmed heartbeat within AckWait")

// leaseTimeout is how long a runner keeps a job without a confirmed beat.
func (r *Runner) leaseTimeout() time.Duration { return r.cfg.AckWait * 2 / 3 }

// heartbeat keeps msg in progress until ctx ends, and calls lost when the
// lease is gone. locks are what the job holds once taken (its project's
// slot, its task lock), refreshed with every beat.
func (r *Runner) heartbeat(ctx context.Context, log *zap.Logger, msg jetstream.Msg, locks []*atomic.Pointer[taskLock], lost context.CancelCauseFunc) {
	interval := r.cfg.AckWait / 3
	t := time.NewTicker(interval)
	defer t.Stop()
	// The job was delivered before the heartbeat started, and the lock is
	// taken after: the first lease runs from now.
	lastSent := time.Now()
	expiry := time.NewTimer(r.leaseTimeout())
	defer expiry.Stop()
	leaseLost := func(err error) {
		log.Error("lease lost: stopping the job", zap.Error(err), zap.Duration("since_last_beat", time.Since(lastSent)))
		lost(errLeaseLost)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			leaseLost(errors.New("no confirmed heartbeat"))
			return
		case <-t.C:
		}
		sent := time.Now()
		deadline := lastSent.Add(r.leaseTimeout())
		held := make([]*taskLock, 0, len(locks))
		for _, l := range locks {
			if l := l.Load(); l != nil {
				held = append(held, l)
			}
		}
		err := r.beat(ctx, msg, held, time.Until(deadline))
		switch {
		case err == nil:
			lastSent = sent
			expiry.Reset(time.Until(sent.Add(r.leaseTimeout())))
		case ctx.Err() != nil:
			return
		case errors.Is(err, errLockLost):
			log.Error("task lock or project slot taken over by another runner: stopping the job", zap.Error(err))
			lost(errLockLost)
			return
		case !time.Now().Before(deadline):
			leaseLost(err)
			return
		default:
			log.Warn("heartbeat not confirmed", zap.Error(err), zap.Duration("since_last_beat", time.Since(lastSent)))
		}
	}
}

// beat sends InProgress and confirms it reached JetStream.
func (r *Runner) beat(ctx context.Context, msg jetstream.Msg, locks []*taskLock, timeout time.Duration) error {
	if err := msg.InProgress(); err != nil {
		return fmt.Errorf("in progress: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("confirming heartbeat: %w", err)
	}
	for _, l := range locks {
		if err := l.refresh(ctx); err != nil {
			return err
		}
	}
	return nil
}
