package runner

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
)

// The settle decision. Every delivery of a job ends in an outcome, which
// says what happened; decide turns it into a verdict, which says what is
// done about it: the record written, what becomes of the message, what is
// counted and logged. decide is pure, so its whole table is one test
// (TestDecide); settle.go applies a verdict. The budget's and the pauses'
// hold and the usage limit's are rows of their own (see hold.go); a
// continued session's resume will be one too.

// An ending is what ended one delivery of a job.
type ending int

const (
	// ranToEnd: the job's own work ended by itself: the agent exited
	// (its error, if any, is the outcome's err), or a cleanup ran.
	ranToEnd ending = iota
	// notPrepared: the worktree, the task text or its file could not be
	// made, so no agent ran.
	notPrepared
	// cannotRun: the job is undecodable or of a project the registry
	// does not know; no delivery of it will ever run.
	cannotRun
	// cancelledBeforeRun: the record said cancelled when the job was
	// pulled.
	cancelledBeforeRun
	// cancelled: the record turned cancelled once the job was taken; its
	// agent, if it ran, was stopped.
	cancelled
	// alreadyDone: the record says done: a success delivered again,
	// because its ack was lost.
	alreadyDone
	// superseded: the record names a later delivery of the job, which
	// went to another runner while this one was cut off.
	superseded
	// leaseLost: no heartbeat was confirmed for too long (see lease.go).
	leaseLost
	// lockLost: another runner took the task lock over (see lock.go).
	lockLost
	// shutdown: the runner is stopping and the agent outlived the grace.
	shutdown
	// onHold: the job may not start now (its project's budget is spent,
	// its credential paused, its project paused by an operator): no
	// agent ran; the outcome's holdReason says why.
	onHold
	// usageLimited: the agent met its account's usage limit; the job
	// waits for the reset (holdUntil) and keeps its attempt.
	usageLimited
)

var endingNames = [...]string{
	ranToEnd: "ran to its end", notPrepared: "not prepared", cannotRun: "cannot run",
	cancelledBeforeRun: "cancelled before it ran", cancelled: "cancelled", alreadyDone: "already done",
	superseded: "superseded", leaseLost: "lease lost", lockLost: "lock lost", shutdown: "shutdown",
	onHold: "on hold", usageLimited: "usage limit",
}

func (e ending) String() string {
	if e < 0 || int(e) >= len(endingNames) {
		return fmt.Sprintf("ending(%d)", int(e))
	}
	return endingNames[e]
}

// The causes with which the runner stops a job's context, and so the
// error of an agent it stopped. endingOf turns them into endings.
var (
	// errShutdown: the runner is shutting down; the job is handed back.
	errShutdown = errors.New("runner shutting down")
	// errCancelled: the job's record turned cancelled.
	errCancelled = errors.New(proto.ReasonCancelled)
	// errOverBudget: the agent's spend passed the job's max_cost_usd (or
	// what was left of the budget): the job fails for good.
	errOverBudget = errors.New(proto.HoldOverBudget)
	// errMaxTurns: the agent took more turns than the project's
	// max_turns: a retry would take as many, so the job fails for good.
	errMaxTurns = errors.New("max_turns")
)

// stopEnding is the ending of a job stopped with cause; ok is false for
// an error that is no stop of the runner's.
func stopEnding(cause error) (e ending, ok bool) {
	switch {
	case errors.Is(cause, errCancelled):
		return cancelled, true
	case errors.Is(cause, errShutdown):
		return shutdown, true
	case errors.Is(cause, errLeaseLost):
		return leaseLost, true
	case errors.Is(cause, errLockLost):
		return lockLost, true
	}
	return 0, false
}

// outcome is how one delivery of a job ended.
type outcome struct {
	end ending
	// exitCode and err are how the work ended: the agent's exit status
	// (-1 when it was killed by a signal or never started) and its error,
	// nil for a success; for the other endings, what stopped the job.
	exitCode int
	err      error
	// took is how long the agent ran.
	took time.Duration
	// claude is Claude Code's result object, when the agent printed one.
	claude *agent.ClaudeResult
	// resumed and restored are what the attempt carried over from the
	// task's earlier work (carry.go), for the record.
	resumed, restored string
	// began is when the attempt started running, once it did.
	began time.Time
	// holdReason and holdUntil are why and until when an onHold or
	// usageLimited job waits (zero: until the hold is lifted).
	holdReason string
	holdUntil  time.Time
	// republished says the message is a held job's, published again: its
	// deliveries do not line up with MaxDeliver, so the last attempt is
	// terminated (the notifier alerts on it) rather than NAKed.
	republished bool
	// spent is what the runner saw the agent spend as it ran (its
	// stream's usage priced, or the egress proxy's meter), for an agent
	// stopped before it reported its cost.
	spent float64
}

// ended is the outcome of work (an agent or a cleanup) that ended with
// res: its own end, or the runner's stop when ctx's cause stopped it.
func ended(res agent.Result, claude *agent.ClaudeResult) outcome {
	out := outcome{end: ranToEnd, exitCode: res.ExitCode, err: res.Err, took: res.Duration, claude: claude}
	if e, ok := stopEnding(res.Err); ok {
		out.end = e
	}
	return out
}

// unprepared is the outcome of a job whose agent could not be started
// for err, or whose preparation the runner stopped.
func unprepared(err error) outcome {
	out := outcome{end: notPrepared, exitCode: -1, err: err}
	if e, ok := stopEnding(err); ok {
		out.end = e
	}
	return out
}

// limits are the settings a verdict depends on.
type limits struct {
	maxAttempts               int
	retryDelay, retryMaxDelay time.Duration
}

// action is what a verdict does with the job's message.
type action int

const (
	// ack: queue the pipeline's next kind, then ack.
	ack action = iota
	// retryAfter: NAK with the verdict's delay (spread ±20 %); JetStream
	// delivers the job again.
	retryAfter
	// fail: NAK the last attempt; JetStream's MAX_DELIVERIES advisory
	// takes the job to the notifier, which alerts and dead-letters it.
	fail
	// terminate: Term with a reason; the notifier alerts on any reason
	// but proto.ReasonCancelled.
	terminate
	// handBack: NAK at once, for another runner to take.
	handBack
	// leaveAlone: touch neither the message nor the record: another
	// runner has the job, or will have it.
	leaveAlone
	// holdBack: ack without the pipeline: the job lives on in its held
	// record, and a releaser publishes it again when the hold ends.
	holdBack
)

var actionNames = [...]string{ack: "ack", retryAfter: "retry after", fail: "fail", terminate: "terminate", handBack: "hand back",
	leaveAlone: "leave alone", holdBack: "hold"}

func (a action) String() string { return actionNames[a] }

// write is the lifecycle transition a verdict records (kit/status).
type write int

const (
	writeNothing write = iota
	writeFinish
	writeRetry
	writeFail
	writeRequeue
	writeReject
	writeStopped
	writeHold
)

var writeNames = [...]string{writeNothing: "-", writeFinish: "finish", writeRetry: "retry", writeFail: "fail",
	writeRequeue: "requeue", writeReject: "reject", writeStopped: "stopped", writeHold: "hold"}

func (w write) String() string { return writeNames[w] }

// verdict is what settles one delivery.
type verdict struct {
	do action
	// record is written first. When the lifecycle refuses it because a
	// later delivery owns the record, the message is left alone instead.
	record write
	// delay is retryAfter's wait before the next delivery, before jitter.
	delay time.Duration
	// reason is terminate's Term reason; empty means
	// proto.TermReason(job id, the recorded error).
	reason string
	// count is the outcome of orch_runner_jobs_finished_total; empty
	// counts nothing (a redelivered success was counted once).
	count string
	// level and note are what the log says.
	level zapcore.Level
	note  string
}

// String is the verdict in a few words, as TestDecide's table has it.
func (v verdict) String() string {
	s := v.do.String()
	if v.do == retryAfter {
		s += " " + v.delay.String()
	}
	if v.reason != "" {
		s += " " + v.reason
	}
	return s + " record=" + v.record.String() + " count=" + v.count
}

// decide is the verdict on out, the outcome of delivery attempt of a job.
func decide(out outcome, attempt int, lim limits) verdict {
	switch out.end {
	case alreadyDone:
		// Finish what the first settle may not have: the pipeline and
		// the ack.
		return verdict{do: ack, level: zapcore.InfoLevel, note: "job already done: acking the redelivery"}
	case cancelledBeforeRun:
		return verdict{do: terminate, reason: proto.ReasonCancelled, count: outcomeCancelled,
			level: zapcore.InfoLevel, note: "job was cancelled before it ran: skipping"}
	case cancelled:
		return verdict{do: terminate, record: writeStopped, reason: proto.ReasonCancelled, count: outcomeCancelled,
			level: zapcore.InfoLevel, note: "job cancelled"}
	case superseded, leaseLost, lockLost:
		// JetStream has given or will give the job to another runner:
		// leave the message and the record to it.
		return verdict{do: leaveAlone, count: outcomeLostLease, level: zapcore.WarnLevel, note: "job lost to another runner: not settling it"}
	case shutdown:
		// Handed back at once: the attempt was not the job's fault.
		return verdict{do: handBack, record: writeRequeue, count: outcomeHandedBack,
			level: zapcore.WarnLevel, note: "job stopped by shutdown: handed back"}
	case onHold:
		// Not an attempt: the delivery is given up for the held record,
		// so MaxDeliver is not spent on waiting.
		return verdict{do: holdBack, record: writeHold, count: outcomeHeld,
			level: zapcore.InfoLevel, note: "job held: it may not start now"}
	case usageLimited:
		return verdict{do: holdBack, record: writeHold, count: outcomeHeld,
			level: zapcore.WarnLevel, note: "agent met the usage limit: job held until it resets, keeping its attempt"}
	case cannotRun:
		// Term removes it from the stream at once, so what is known of it
		// goes to the record first: the notifier reads it from there.
		return verdict{do: terminate, record: writeReject, count: outcomeFailed,
			level: zapcore.ErrorLevel, note: "terminated job that cannot run"}
	}
	// The job's own work ended: ranToEnd or notPrepared.
	switch {
	case errors.Is(out.err, agent.ErrPermissionDenied):
		// Denied tools, or Claude Code refusing to bypass permissions as
		// root: a retry would fail the same way, so fail the job now. The
		// notifier alerts on a runner's Term and dead-letters the job like
		// any failure.
		return verdict{do: terminate, record: writeFail, count: outcomeFailed,
			level: zapcore.ErrorLevel, note: "agent lacks the permissions it needs: job failed without retries"}
	case errors.Is(out.err, errOverBudget), errors.Is(out.err, errMaxTurns):
		// A retry would spend again: fail for good, alerted once.
		return verdict{do: terminate, record: writeFail, count: outcomeFailed,
			level: zapcore.ErrorLevel, note: "agent passed its spend or turn limit: job failed without retries"}
	case out.err == nil:
		return verdict{do: ack, record: writeFinish, count: outcomeDone, level: zapcore.InfoLevel, note: "job done"}
	case attempt < lim.maxAttempts:
		return verdict{do: retryAfter, record: writeRetry, delay: backoff.Doubling(lim.retryDelay, lim.retryMaxDelay, attempt-1),
			count: outcomeRetry, level: zapcore.WarnLevel, note: "agent failed: will retry"}
	case out.republished:
		// The message's MaxDeliver is not the job's last attempt: end it
		// here, through the notifier as any failure.
		return verdict{do: terminate, record: writeFail, count: outcomeFailed, level: zapcore.ErrorLevel, note: "agent failed on its last attempt"}
	default:
		return verdict{do: fail, record: writeFail, count: outcomeFailed, level: zapcore.ErrorLevel, note: "agent failed on its last attempt"}
	}
}
