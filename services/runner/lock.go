package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
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
// A runner that dies holding a lock cannot delete it, so a waiting runner
// takes over a lock that is stale: one whose current revision JetStream
// stored more than staleAfter (AckWait plus the kill grace) ago. Both ends
// of that age are read from the server's clock: the revision's timestamp
// (KeyValueEntry.Created) and the server's time in a stream info answer
// (StreamInfo.TimeStamp). No host's clock is compared with another's, and
// the age does not depend on when the waiter first looked, so a job
// redelivered after its runner crashed takes the lock as soon as the dead
// holder's last refresh is staleAfter old: about AckWait plus the kill
// grace after the crash, not AckWait later still.
//
// Why a stale lock's agent is certainly gone. A holder's lease (see
// heartbeat) runs from the moment it sent its last confirmed beat, and
// each confirmed beat of a holder includes a refresh of the lock, which
// JetStream stamps after it was sent. A holder that has had no confirmed
// beat for leaseTimeout (2/3 of AckWait) stops its agent, which is gone
// within the kill grace. So when a revision is leaseTimeout plus the kill
// grace old by the server's clock, its holder has stopped its agent;
// staleAfter keeps a third of AckWait more, for scheduling delays and for
// the clocks of a cluster's servers, which must agree to well within it
// (NTP does) and must not be stepped.
//
// A JetStream restart. The timestamps are stored with the messages, so
// after a restart a revision's age is still the real time since its
// holder's refresh, outage included. A lock can look older than staleAfter
// right after a restart only if its holder has not refreshed it for that
// long, and that holder's lease ran out during the outage: it has stopped
// its agent. A holder that is alive after the restart reconnects and
// refreshes on its next beat, within AckWait/3, long before its revision
// could look stale. JetStream may redeliver, after a restart, a job whose
// runner is alive and still running it; that delivery waits like any
// other: a lock held by an earlier delivery of the same job is never
// taken over just for being earlier, since its agent may still run. A
// takeover is a compare-and-set on the stale revision, so a waiter that
// read an old revision (a replica lagging behind) takes nothing: the
// holder's newer refresh makes it fail. All this rests on JetStream
// keeping what it acknowledged: a single server that loses its last
// writes in an OS crash (sync_interval other than always) and is back
// within the lease could show a holder's older revision as stale.
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

// taskLockOf is job's task lock, not yet taken.
func (r *Runner) taskLockOf(job *proto.Job, attempt int) (*taskLock, error) {
	value, err := json.Marshal(lockValue{Job: job.ID, Attempt: attempt, Runner: r.cfg.Name, Since: time.Now().UTC()})
	if err != nil {
		return nil, fmt.Errorf("encoding task lock: %w", err)
	}
	return &taskLock{kv: r.locks, key: lockKey(job), value: value}, nil
}

// take creates l's key: jetstream.ErrKeyExists while another holds it.
func (l *taskLock) take(ctx context.Context) error {
	rev, err := l.kv.Create(ctx, l.key, l.value)
	if err == nil {
		l.rev = rev
	}
	return err
}

// takeFreed is take of a key whose last message, as read, was the delete
// marker at revision freed (0: none read): an update at that revision,
// one round trip where a create costs three (see queueView.freed). When
// the key changed since, it is take, which says whether another holds it.
func (l *taskLock) takeFreed(ctx context.Context, freed uint64) error {
	if freed == 0 {
		return l.take(ctx)
	}
	rev, err := l.kv.Update(ctx, l.key, l.value, freed)
	if err != nil {
		return l.take(ctx)
	}
	l.rev = rev
	return nil
}

// acquireLock waits until it holds l or ctx ends. A failing NATS is
// waited out: the heartbeat decides when the job is lost.
func (r *Runner) acquireLock(ctx context.Context, log *zap.Logger, l *taskLock) error {
	waitLogged := false
	poll := min(r.cfg.AckWait/4, time.Second)
	for {
		wait := poll
		err := l.take(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			e, gerr := r.locks.Get(ctx, l.key)
			switch {
			case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
				continue // released meanwhile
			case gerr != nil:
				log.Debug("reading task lock", zap.Error(gerr))
			case bytes.Equal(e.Value(), l.value):
				// This delivery's own: a create whose answer was lost,
				// or one taken beside a slot and not given back.
				l.rev = e.Revision()
				return nil
			default:
				age, aerr := r.lockAge(ctx, e)
				if !waitLogged {
					log.Info("task busy: waiting for its lock", zap.String("lock", l.key), zap.ByteString("holder", e.Value()), zap.Duration("age", age))
					waitLogged = true
				}
				if aerr != nil {
					log.Debug("reading the server's time", zap.Error(aerr))
					break
				}
				if age <= r.staleAfter() {
					// Look again as the lock turns stale, if it is not
					// refreshed before.
					wait = min(poll, r.staleAfter()-age+time.Millisecond)
					break
				}
				rev, uerr := r.locks.Update(ctx, l.key, l.value, e.Revision())
				if uerr == nil {
					log.Warn("took over a stale task lock", zap.String("lock", l.key), zap.ByteString("holder", e.Value()), zap.Duration("age", age))
					l.rev = rev
					return nil
				}
			}
		} else if ctx.Err() == nil {
			log.Debug("taking task lock", zap.Error(err))
		}
		if !backoff.Sleep(ctx, wait) {
			return context.Cause(ctx)
		}
	}
}

// lockAge is how long ago JetStream stored e, by the server's clock: the
// entry's timestamp against the server's time in a stream info answer.
func (r *Runner) lockAge(ctx context.Context, e jetstream.KeyValueEntry) (time.Duration, error) {
	s, err := r.js.Stream(ctx, proto.StreamTaskLocks)
	if err != nil {
		return 0, err
	}
	now := s.CachedInfo().TimeStamp
	if now.IsZero() {
		return 0, errors.New("stream info without the server's time")
	}
	return now.Sub(e.Created()), nil
}

// staleAfter is how old, by the server's clock, the revision of a lock
// must be before a waiting runner takes it over.
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
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return fmt.Errorf("refreshing task lock: %w", err)
	}
	// The revision moved. An earlier refresh whose answer was lost (it
	// timed out here but JetStream stored it) moves it too, and leaves
	// this holder's own value: the lock is still held, at that revision.
	// This beat is not confirmed all the same: the lease must run from a
	// refresh stamped after the beat was sent, and the next beat's refresh
	// is. Any other value means a waiter took the lock over.
	e, gerr := l.kv.Get(ctx, l.key)
	switch {
	case gerr == nil && bytes.Equal(e.Value(), l.value):
		l.rev = e.Revision()
		return fmt.Errorf("refreshing task lock: the answer to an earlier refresh was lost (now at revision %d)", l.rev)
	case gerr == nil, errors.Is(gerr, jetstream.ErrKeyNotFound), errors.Is(gerr, jetstream.ErrKeyDeleted):
		return errLockLost
	default:
		return fmt.Errorf("reading task lock after a lost refresh: %w", gerr)
	}
}

// release deletes the lock if it is still this holder's.
func (l *taskLock) release(ctx context.Context) error {
	if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(l.rev)); err != nil {
		return fmt.Errorf("releasing task lock %s: %w", l.key, err)
	}
	return nil
}
