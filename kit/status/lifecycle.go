package status

import (
	"errors"
	"time"

	"github.com/orch-dev/orch/proto"
)

// The job lifecycle. Every change of a status record is one of the named
// transitions below, applied by Store.Apply; nothing else writes the
// bucket. "absent" is a job with no record yet: a job the gateway queued
// waits in JOBS without one until a runner takes it (or a second has
// passed), and the first transition applied to it creates it. Who
// applies each transition is in brackets.
//
//	absent ──Queue [gateway, after a second; runner's pipeline]──► queued
//
//	absent, queued, held, retrying, running ──StartAttempt [runner]──► running
//	running ──Progress [runner]──► running (same attempt)
//
//	running ──Finish [runner]──► done
//	running ──Retry [runner]───► retrying
//	running ──Fail [runner]────► failed (last attempt)
//	running ──Requeue [runner]─► queued (runner shut down)
//	absent, queued, running, retrying ──Reject [runner]──► failed (cannot run)
//
//	absent, queued, held, running, retrying ──Hold [runner]──► held
//	held ──Release [runner's releaser, gateway]──► queued
//
//	absent, queued, held, running, retrying ──Cancel [gateway]──► cancelled
//	absent, queued, held, running, retrying ──Supersede [gateway]──► cancelled (a newer job replaced it)
//	cancelled ──Stopped [runner]──► cancelled (how the stopped attempt ended)
//
//	absent, queued, running, retrying, failed ──DeadLetter [notifier]──► failed
//	failed ──MarkAlerted [notifier]──► failed (once)
//
// Hold is how a job that may not start yet waits without spending its
// deliveries: the runner that pulled it records it held (not an attempt:
// the record's attempt goes back to those used before) and acks its
// message; when the hold ends, a releaser publishes the job again
// (proto.HeldMsgID) and applies Release, which makes the next message's
// deliveries count on from the attempts already used (AttemptBase).
//
// The runner's transitions accept any non-terminal record of their attempt
// or an earlier one (a redelivery may settle a job whose record still says
// queued), so the arrows above name the usual source.
//
// The guards, checked on every write against the record as it is then:
//
//   - Never back from terminal: done, failed and cancelled are final. A
//     transition into them from a terminal record is refused with
//     ErrTerminal; the only writes on a terminal record are DeadLetter and
//     MarkAlerted on a failed one and Stopped on a cancelled one, none of
//     which changes the state.
//   - Never over a later attempt: a runner's write for attempt n is refused
//     with ErrSuperseded once the record names attempt n+1 or later (a
//     stalled runner must not undo the work of the one JetStream gave the
//     job to next).
//   - Cancelled wins: nothing but Stopped writes a cancelled record, so a
//     cancel that lands while a runner settles is never overwritten.
//   - Queue creates only: a job that already has a record keeps it
//     (ErrExists): whatever a runner wrote stands.
//   - Alert once: MarkAlerted is refused with ErrAlerted when the record
//     says a person was told already.

// Refusals: a transition whose guard does not hold returns one of these,
// and Store.Apply leaves the record as it is.
var (
	// ErrNotFound is returned for a job id with no status record.
	ErrNotFound = errors.New("no such job")
	// ErrTerminal is returned for a job that has already ended.
	ErrTerminal = errors.New("job has already ended")
	// ErrSuperseded is returned for a write of an attempt older than the
	// record's.
	ErrSuperseded = errors.New("a later attempt owns the job")
	// ErrRunning is returned by Supersede, where it may not stop a
	// running job, for one that runs.
	ErrRunning = errors.New("job is running")
	// ErrExists is returned by Queue for a job that has a record.
	ErrExists = errors.New("job is already queued")
	// ErrAlerted is returned by MarkAlerted when the alert was recorded
	// before.
	ErrAlerted = errors.New("job was alerted on already")
	// ErrNotRunning is returned by Progress when the record is not that
	// attempt's running state.
	ErrNotRunning = errors.New("job is not running that attempt")
	// ErrNotCancelled is returned by Stopped for a record that is not
	// cancelled.
	ErrNotCancelled = errors.New("job is not cancelled")
)

// absent is the pseudo-state of a job with no record: the transitions see
// a record with this state, holding only the job.
const absent proto.State = ""

// Transition is one named change of a status record. Build one with the
// functions below and hand it to Store.Apply.
type Transition struct {
	// Name says what happened, for logs and errors.
	Name string
	// apply checks the guard on st (the record as it is now, State absent
	// when there is none) and changes st, or returns a refusal.
	apply func(st *proto.Status) error
	// absentOnly says apply refuses every record but an absent one, so
	// Apply may try to create the record before reading it.
	absentOnly bool
}

// Outcome is how an attempt ended, as the runner records it.
type Outcome struct {
	Attempt, MaxAttempts int
	Runner               string
	FinishedAt           time.Time
	ExitCode             int
	// Err is the attempt's error; empty for a success.
	Err string
	// CostUSD, Turns, SessionID and Result are what the agent reported,
	// when it did (Agent false: it reported nothing). Result is recorded
	// for a success only: a failed run's text is already its error.
	Agent     bool
	CostUSD   float64
	Turns     int
	SessionID string
	Result    string
	// Resumed and Restored are what the attempt carried over from the
	// task's earlier work (proto.Status.Resumed and Restored).
	Resumed, Restored string
}

// Queue records a new job as queued. Only an absent job can be queued:
// otherwise ErrExists, and whatever a runner wrote meanwhile stands.
func Queue(maxAttempts int) Transition {
	return Transition{Name: "queue", absentOnly: true, apply: func(st *proto.Status) error {
		if st.State != absent {
			return ErrExists
		}
		st.State, st.MaxAttempts = proto.StateQueued, maxAttempts
		return nil
	}}
}

// attemptGuard holds for a runner's write of attempt on st: the record is
// not terminal and no later attempt owns it.
func attemptGuard(st *proto.Status, attempt int) error {
	if st.State.Terminal() {
		return ErrTerminal
	}
	if st.Attempt > attempt {
		return ErrSuperseded
	}
	return nil
}

// StartAttempt records that a runner started attempt of the job, logging
// to logPath (empty: the log is only in StreamLogs): from absent, queued,
// retrying, or running (an earlier attempt whose runner was lost).
func StartAttempt(attempt, maxAttempts int, runner, logPath string, now time.Time) Transition {
	return Transition{Name: "start attempt", apply: func(st *proto.Status) error {
		if err := attemptGuard(st, attempt); err != nil {
			return err
		}
		st.State, st.Attempt, st.MaxAttempts = proto.StateRunning, attempt, maxAttempts
		st.Runner, st.StartedAt, st.FinishedAt = runner, now, time.Time{}
		st.Log, st.Error, st.ExitCode = logPath, "", nil
		st.Result, st.CostUSD, st.Turns, st.SessionID = "", 0, 0, ""
		st.LastActivity = time.Time{}
		return nil
	}}
}

// With is t that also applies set to the record once t's guard held and
// t changed it: what a runner adds to a transition of its own (how it
// confined the attempt, on StartAttempt).
func (t Transition) With(set func(*proto.Status)) Transition {
	apply := t.apply
	t.apply = func(st *proto.Status) error {
		if err := apply(st); err != nil {
			return err
		}
		set(st)
		return nil
	}
	return t
}

// Progress applies set to the running record of attempt; set changes only
// what the attempt reports while it runs, never the state or the attempt.
func Progress(attempt int, set func(*proto.Status)) Transition {
	return Transition{Name: "progress", apply: func(st *proto.Status) error {
		if err := attemptGuard(st, attempt); err != nil {
			return err
		}
		if st.State != proto.StateRunning || st.Attempt != attempt {
			return ErrNotRunning
		}
		set(st)
		return nil
	}}
}

// settled is the shared shape of the runner's transitions out of an
// attempt: Finish, Retry, Fail and Requeue.
func settled(name string, state proto.State, o Outcome) Transition {
	return Transition{Name: name, apply: func(st *proto.Status) error {
		if err := attemptGuard(st, o.Attempt); err != nil {
			return err
		}
		// The attempt's cost joins the job's once: a write applied again
		// (its answer lost) finds the attempt settled already.
		if o.Agent && st.State == proto.StateRunning && st.Attempt == o.Attempt {
			st.SpentUSD += o.CostUSD
		}
		st.State, st.Attempt, st.MaxAttempts = state, o.Attempt, o.MaxAttempts
		st.FinishedAt, st.Runner = o.FinishedAt, o.Runner
		st.Resumed, st.Restored = o.Resumed, o.Restored
		code := o.ExitCode
		st.ExitCode, st.Error = &code, o.Err
		// What the agent reported is this attempt's: an attempt without a
		// report shows none, not an earlier attempt's.
		st.Result, st.CostUSD, st.Turns, st.SessionID = "", 0, 0, ""
		if o.Agent {
			st.CostUSD, st.Turns, st.SessionID = o.CostUSD, o.Turns, o.SessionID
			if state == proto.StateDone {
				st.Result = o.Result
			}
		}
		return nil
	}}
}

// Finish records a successful attempt: done.
func Finish(o Outcome) Transition { return settled("finish", proto.StateDone, o) }

// Retry records a failed attempt that JetStream delivers again: retrying.
func Retry(o Outcome) Transition { return settled("retry", proto.StateRetrying, o) }

// Fail records the failed last attempt: failed, until the notifier's
// DeadLetter.
func Fail(o Outcome) Transition { return settled("fail", proto.StateFailed, o) }

// Requeue records an attempt stopped by the runner's shutdown, handed back
// to JetStream: queued again, since the job was not at fault.
func Requeue(o Outcome) Transition { return settled("requeue", proto.StateQueued, o) }

// Reject records a job that can never run (undecodable, or of an unknown
// project) and is terminated: failed, with cause.
func Reject(attempt, maxAttempts int, runner, cause string, now time.Time) Transition {
	return Transition{Name: "reject", apply: func(st *proto.Status) error {
		if err := attemptGuard(st, attempt); err != nil {
			return err
		}
		st.State, st.Attempt, st.MaxAttempts = proto.StateFailed, attempt, maxAttempts
		st.Error, st.Runner, st.FinishedAt = cause, runner, now
		return nil
	}}
}

// Hold records that the runner that pulled delivery attempt of the job
// may not start it, for reason (proto.HoldOverBudget, HoldUsageLimit,
// HoldOperator), until until where that is known (zero: until the hold is
// lifted): held. The delivery is not an attempt, nor is one that met a
// usage limit: the record's attempt goes back to attempt-1, the attempts
// used. A hand release (ReleasedBy) is spent by a new hold.
func Hold(attempt int, runner, reason string, until, now time.Time) Transition {
	return Transition{Name: "hold", apply: func(st *proto.Status) error {
		if err := attemptGuard(st, attempt); err != nil {
			return err
		}
		st.State, st.Attempt, st.Runner = proto.StateHeld, max(attempt-1, 0), runner
		st.HeldReason, st.HeldUntil, st.HeldAt = reason, until, now
		st.Holds++
		st.ReleasedBy = ""
		return nil
	}}
}

// ErrNotHeld is returned by Release for a record that is not held.
var ErrNotHeld = errors.New("job is not held")

// Release records that a held job was published again (its hold ended,
// or by names who released it by hand; empty: by itself): queued, its
// next message's deliveries counted on from the attempts it used.
func Release(by string) Transition {
	return Transition{Name: "release", apply: func(st *proto.Status) error {
		switch {
		case st.State == absent:
			return ErrNotFound
		case st.State != proto.StateHeld:
			return ErrNotHeld
		}
		st.State, st.AttemptBase, st.ReleasedBy = proto.StateQueued, st.Attempt, by
		return nil
	}}
}

// Cancel records that a person cancelled the job: from queued, held,
// running or retrying, or absent (a job waiting in JOBS has no record
// until a runner takes it: the cancel creates it). The runners skip or
// stop a cancelled job.
func Cancel() Transition {
	return Transition{Name: "cancel", apply: func(st *proto.Status) error {
		if st.State.Terminal() {
			return ErrTerminal
		}
		st.State, st.Error = proto.StateCancelled, proto.ReasonCancelled
		return nil
	}}
}

// Supersede records that job by, newer, of the same task and kind,
// replaces the job: cancelled with proto.ReasonSuperseded, as a cancel
// (the runners skip or stop it, nobody is alerted). A running job is
// superseded only when running is set (registry supersede: running); else
// it is refused with ErrRunning.
func Supersede(by string, running bool) Transition {
	c := Cancel()
	return Transition{Name: "supersede", apply: func(st *proto.Status) error {
		if st.State == proto.StateRunning && !running {
			return ErrRunning
		}
		if err := c.apply(st); err != nil {
			return err
		}
		st.Error, st.SupersededBy = proto.ReasonSuperseded, by
		return nil
	}}
}

// Stopped adds to a cancelled record how the runner's stopped attempt
// ended; the state stays cancelled.
func Stopped(attempt int, runner string, exitCode int, now time.Time) Transition {
	return Transition{Name: "stopped", apply: func(st *proto.Status) error {
		if st.State != proto.StateCancelled {
			return ErrNotCancelled
		}
		if st.Attempt > attempt {
			return ErrSuperseded
		}
		code := exitCode
		st.ExitCode, st.FinishedAt, st.Runner = &code, now, runner
		if st.Error != proto.ReasonSuperseded {
			st.Error = proto.ReasonCancelled
		}
		return nil
	}}
}

// DeadLetter records that the notifier moved the job to StreamDLQ at
// dlqSeq (0: it has no message to keep) after attempts deliveries: failed,
// from any state but done and cancelled.
func DeadLetter(attempts int, dlqSeq uint64, now time.Time) Transition {
	return Transition{Name: "dead-letter", apply: func(st *proto.Status) error {
		if st.State == proto.StateDone || st.State == proto.StateCancelled {
			return ErrTerminal
		}
		st.State, st.Attempt = proto.StateFailed, max(st.Attempt, attempts)
		if dlqSeq != 0 {
			st.DLQSeq = dlqSeq
		}
		if st.FinishedAt.IsZero() {
			st.FinishedAt = now
		}
		return nil
	}}
}

// MarkAlerted records that a person was told of the job's failure, once.
func MarkAlerted() Transition {
	return Transition{Name: "mark alerted", apply: func(st *proto.Status) error {
		if st.State != proto.StateFailed {
			return ErrNotFailed
		}
		if st.Alerted {
			return ErrAlerted
		}
		st.Alerted = true
		return nil
	}}
}

// ErrNotFailed is returned by MarkAlerted for a record that is not failed.
var ErrNotFailed = errors.New("job has not failed")
