package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
)

// Task locks.
//
// Two jobs of one task must never work in the task's worktree at once, on
// one runner or across several. The lock is a key <project>.<task> in the
// KV bucket proto.BucketTaskLocks, taken with Create (which fails if the
// key exists), refreshed with a compare-and-set Update on every heartbeat,
// and deleted (again compare-and-set) when the job ends.
//
// A runner that dies holding a lock cannot delete it. Rather than trust
// clocks of different hosts, a waiting runner measures on its own
// monotonic clock how long the lock's revision has stayed the same. A
// holder refreshes it on every confirmed heartbeat (every AckWait/3), and
// one that has had no confirmed beat for 2/3 of AckWait stops its agent
// within the kill grace (see heartbeat). So a revision unchanged for
// staleAfter (AckWait plus the kill grace: a third of AckWait to spare)
// belongs to a holder whose agent is gone, and is taken over with a
// compare-and-set on that revision.
//
// An earlier delivery of the same job is not taken over at once, although
// JetStream has redelivered it: after a server restart JetStream may
// redeliver a job whose runner is alive and still running it.
//
// The waiting job keeps its message with InProgress (the heartbeat runs
// while it waits), so waiting burns no attempt.

// errLockLost is the cause of a job whose task lock another runner took.
var errLockLost = errors.New("task lock lost to another runner")

// lockValue is what a lock names: who holds it.
type lockValue struct {
	Job     string    `json:"job"`
	Attempt int       `json:"attempt"`
	Runner  string    `json:"runner"`
	Since   time.Time `json:"since"`
}

// taskLock is a held lock. Its methods are called from the job's goroutine
// and its heartbeat, one at a time (the heartbeat owns it once acquired).
type taskLock struct {
	kv    jetstream.KeyValue
	key   string
	value []byte
	rev   uint64
}

func lockKey(job *proto.Job) string {
	return proto.Token(job.Project) + "." + proto.Token(job.Task.ID)
}

// acquireLock waits until it holds the task's lock or ctx ends. A failing
// NATS is waited out: the heartbeat decides when the job is lost.
func (r *Runner) acquireLock(ctx context.Context, log *zap.Logger, job *proto.Job, attempt int) (*taskLock, error) {
	value, err := json.Marshal(lockValue{Job: job.ID, Attempt: attempt, Runner: r.cfg.Name, Since: time.Now().UTC()})
	if err != nil {
		return nil, fmt.Errorf("encoding task lock: %w", err)
	}
	l := &taskLock{kv: r.locks, key: lockKey(job), value: value}
	var (
		seenRev    uint64
		seenAt     time.Time
		waitLogged bool
	)
	poll := min(r.cfg.AckWait/4, time.Second)
	for {
		rev, err := r.locks.Create(ctx, l.key, value)
		if err == nil {
			l.rev = rev
			return l, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			e, gerr := r.locks.Get(ctx, l.key)
			switch {
			case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
				continue // released meanwhile
			case gerr != nil:
				log.Debug("reading task lock", zap.Error(gerr))
			case e.Revision() != seenRev:
				seenRev, seenAt = e.Revision(), time.Now()
				if !waitLogged {
					log.Info("task busy: waiting for its lock", zap.String("lock", l.key), zap.ByteString("holder", e.Value()))
					waitLogged = true
				}
			case time.Since(seenAt) > r.staleAfter():
				rev, uerr := r.locks.Update(ctx, l.key, value, seenRev)
				if uerr == nil {
					log.Warn("took over a stale task lock", zap.String("lock", l.key), zap.ByteString("holder", e.Value()))
					l.rev = rev
					return l, nil
				}
			}
		} else if ctx.Err() == nil {
			log.Debug("taking task lock", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(poll):
		}
	}
}

// staleAfter is how long a lock's revision must stay unchanged before a
// waiting runner takes it over.
func (r *Runner) staleAfter() time.Duration {
	return r.cfg.AckWait + r.cfg.KillGrace
}

// refresh proves the holder alive. It fails with errLockLost when another
// runner took the lock over.
func (l *taskLock) refresh(ctx context.Context) error {
	rev, err := l.kv.Update(ctx, l.key, l.value, l.rev)
	if err == nil {
		l.rev = rev
		return nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return errLockLost
	}
	return fmt.Errorf("refreshing task lock: %w", err)
}

// release deletes the lock if it is still this holder's.
func (l *taskLock) release(ctx context.Context) error {
	if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(l.rev)); err != nil {
		return fmt.Errorf("releasing task lock %s: %w", l.key, err)
	}
	return nil
}
