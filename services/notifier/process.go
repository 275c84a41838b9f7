package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/logread"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/alert"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

// Outcomes of an advisory, the label of the advisories metric.
const (
	outcomeAlerted   = "alerted"
	outcomeLogged    = "logged"
	outcomeCancelled = "cancelled"
	outcomeDone      = "already_handled"
)

// result is how handling one advisory ended.
type result struct {
	outcome string
	// job is the failed job's id, once known, for the log.
	job string
	// sentAt is when a message went to Telegram, for the pace.
	sentAt time.Time
	// err says the advisory must be tried again, after retryIn if that
	// is set, else after the backoff.
	err     error
	retryIn time.Duration
}

// failure is one job that failed for good, as the notifier found it.
type failure struct {
	st       *proto.Status
	attempts int
	reason   string
	// data is the job to copy to JOBS_DLQ on dlqSubject: the message as it
	// was in JOBS, or the job from its status record. nil when the job is
	// gone for good (terminated, with no status record).
	data       []byte
	dlqSubject string
}

// process dead-letters and alerts on one failed job. Each step is safe to
// repeat; see the package comment. Waits end with ctx; a step that has
// begun is finished even when ctx ends (bounded by opTimeout).
func (n *Notifier) process(ctx context.Context, log *zap.Logger, adv *proto.Advisory) result {
	if adv.Type == proto.AdvisoryTerminated && adv.Reason == proto.ReasonCancelled {
		log.Info("job cancelled: no alert")
		return result{outcome: outcomeCancelled}
	}
	if id, _ := proto.ParseTermReason(adv.Reason); adv.Type == proto.AdvisoryTerminated && id == "" {
		// Only a runner terminates with "<job id>: <cause>". The server
		// sends MSG_TERMINATED of its own, e.g. "Unacknowledged message
		// was deleted" when a clustered work queue catches up after a
		// node restart, for jobs that were acked long ago.
		log.Info("termination not by a runner: no alert", zap.String("reason", adv.Reason))
		return result{outcome: outcomeDone}
	}
	op, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()

	f, err := n.failure(op, adv)
	if errors.Is(err, errHandled) {
		log.Info("job no longer in JOBS: nothing left to do")
		return result{outcome: outcomeDone}
	}
	if err != nil {
		return result{err: err}
	}
	job := &f.st.Job
	log = log.With(zap.String("job", job.ID), zap.String("project", job.Project), zap.String("kind", string(job.Kind)))
	if f.st.State == proto.StateCancelled {
		log.Info("job cancelled: no alert")
		if err := n.removeJob(op, adv); err != nil {
			return result{job: job.ID, err: err}
		}
		return result{job: job.ID, outcome: outcomeCancelled}
	}

	if f.st.State == proto.StateDone {
		// Its success was recorded, yet its message was not acked: the
		// record stands, and there is nothing to alert on.
		log.Info("job done: no alert")
		if err := n.removeJob(op, adv); err != nil {
			return result{job: job.ID, err: err}
		}
		return result{job: job.ID, outcome: outcomeDone}
	}

	// Dead-letter first: the job is kept and shown failed even while
	// Telegram is down.
	st := f.st
	if st.State != proto.StateFailed || (st.DLQSeq == 0 && f.data != nil) {
		var seq uint64
		if st.DLQSeq == 0 && f.data != nil {
			if seq, err = n.deadLetter(op, f); err != nil {
				return result{job: job.ID, err: err}
			}
		}
		st, err = n.status.Apply(op, job, status.DeadLetter(f.attempts, seq, time.Now().UTC()))
		if errors.Is(err, status.ErrTerminal) {
			// Cancelled or done since it was read: nothing to alert on.
			log.Info("job ended meanwhile: no alert", zap.String("state", string(st.State)))
			if err := n.removeJob(op, adv); err != nil {
				return result{job: job.ID, err: err}
			}
			return result{job: job.ID, outcome: outcomeDone}
		}
		if err != nil {
			return result{job: job.ID, err: err}
		}
		log.Info("job dead-lettered", zap.Uint64("dlq_seq", st.DLQSeq))
	}

	res := result{job: job.ID, outcome: outcomeLogged}
	switch {
	case st.Alerted:
		log.Info("already alerted: not sending again")
		res.outcome = outcomeDone
	case n.tg == nil:
		log.Warn("job failed for good (no Telegram configured)", zap.String("alert", n.render(ctx, log, f, st)))
	default:
		res.outcome = outcomeAlerted
		if res.sentAt, res.retryIn, err = n.alert(ctx, op, log, f, st); err != nil {
			return result{job: job.ID, err: err, retryIn: res.retryIn}
		}
		if n.hooks.alerted != nil {
			n.hooks.alerted(n)
		}
	}

	// Last, so that an advisory whose job is gone from JOBS is one that
	// was handled in full.
	if err := n.removeJob(op, adv); err != nil {
		res.err = err
		return res
	}
	log.Info("failure handled", zap.String("outcome", res.outcome))
	return res
}

// failure finds the job an advisory is about. A job that hit MaxDeliver is
// still in JOBS; a terminated one is gone from it, and its Term reason
// names its status record.
func (n *Notifier) failure(ctx context.Context, adv *proto.Advisory) (*failure, error) {
	f := &failure{attempts: int(adv.Deliveries)}
	if adv.Type == proto.AdvisoryTerminated {
		id, cause := proto.ParseTermReason(adv.Reason)
		f.reason = "terminated: " + cause
		st, _, err := n.status.Get(ctx, id)
		if errors.Is(err, status.ErrNotFound) {
			// The job left nothing behind: alert on what is known.
			f.st = &proto.Status{Job: proto.Job{ID: id}, Error: cause}
			return f, nil
		}
		if err != nil {
			return nil, err
		}
		if f.data, err = json.Marshal(st.Job); err != nil {
			return nil, fmt.Errorf("encoding job %s: %w", id, err)
		}
		f.st, f.dlqSubject = st, proto.DLQSubject(st.Job.Project, st.Job.Kind)
		return f, nil
	}

	f.reason = "failed on every attempt"
	stream, err := n.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return nil, fmt.Errorf("looking up stream %s: %w", proto.StreamJobs, err)
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Removed by an earlier try of this advisory, whose last step
		// that is, or acked by a runner that finished late.
		return nil, errHandled
	}
	if err != nil {
		return nil, fmt.Errorf("reading job at %s seq %d: %w", proto.StreamJobs, adv.StreamSeq, err)
	}
	job, err := proto.DecodeJob(raw.Data)
	undecodable := job == nil || job.ID == ""
	if undecodable {
		// Undecodable, yet it reached MaxDeliver: alert anyway, named by
		// its sequence as the runner names it, and by its subject.
		job = &proto.Job{ID: proto.UndecodableJobID(adv.StreamSeq)}
		if parts := strings.Split(raw.Subject, "."); len(parts) == 3 {
			job.Project, job.Kind = parts[1], proto.Kind(parts[2])
		}
		f.reason += fmt.Sprintf(" (undecodable job: %v)", err)
	}
	st, _, err := n.status.Get(ctx, job.ID)
	if errors.Is(err, status.ErrNotFound) && undecodable {
		st, _, err = n.status.Get(ctx, legacyUndecodableID(adv.StreamSeq))
	}
	if errors.Is(err, status.ErrNotFound) {
		st, err = &proto.Status{Job: *job, State: proto.StateQueued}, nil
	}
	if err != nil {
		return nil, err
	}
	f.st, f.data, f.dlqSubject = st, raw.Data, proto.DLQSubject(job.Project, job.Kind)
	return f, nil
}

// legacyUndecodableID is the name notifiers before
// proto.UndecodableJobID gave an undecodable job's record. A record one of
// them left (it dead-lettered or alerted, and stopped before the job left
// JOBS) is read by it, so the job is not dead-lettered or alerted twice.
func legacyUndecodableID(seq uint64) string { return "jobs-seq-" + strconv.FormatUint(seq, 10) }

// render is the alert text of f.
func (n *Notifier) render(ctx context.Context, log *zap.Logger, f *failure, st *proto.Status) string {
	return alert.Render(alert.Failure{
		Status: st, Attempts: f.attempts, Reason: f.reason,
		LogTail: n.logTail(ctx, log, st),
		JobURL:  n.jobURL(st.Job.ID),
	})
}

// logTail is the end of the readable output of the job's last attempt,
// read from JOBS_LOGS, so that no disk is shared with the runner. Should
// the stream not have it (a runner that cannot reach JetStream, output
// aged out), the runner's log file stands in when it is readable here.
func (n *Notifier) logTail(ctx context.Context, log *zap.Logger, st *proto.Status) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tail, err := logread.Tail(ctx, n.js, st.Job.ID, st.Attempt, alert.LogTailBytes)
	if err != nil {
		log.Warn("reading the log tail from the stream", zap.Error(err))
	}
	if tail != "" {
		return alert.LastLines(tail, alert.LogTailLines)
	}
	return alert.LogTail(st.Log, alert.LogTailLines)
}

// alert sends the message of one failure and records that it was sent.
// It waits for the chat's pace with ctx, so a shutdown interrupts the
// wait; the request and the marker use op, so once a message is out the
// marker is written even during a shutdown. On error it may say how long
// to wait before the next try.
func (n *Notifier) alert(ctx, op context.Context, log *zap.Logger, f *failure, st *proto.Status) (sentAt time.Time, retryIn time.Duration, err error) {
	text := n.render(op, log, f, st)
	if err := n.tg.Wait(ctx); err != nil {
		return time.Time{}, 0, fmt.Errorf("waiting for Telegram's pace: %w", err)
	}
	sentAt = time.Now()
	if err := n.tg.Send(op, text); err != nil {
		var rl *telegram.RateLimitedError
		switch {
		case errors.As(err, &rl):
			n.metrics.rateLimited.Inc()
			return time.Time{}, rl.RetryAfter, err
		case errors.Is(err, telegram.ErrRejected):
			n.metrics.failed.WithLabelValues("rejected").Inc()
			log.Error("TELEGRAM REJECTS ALERTS: check ORCH_TELEGRAM_BOT_TOKEN, ORCH_TELEGRAM_CHAT_ID and that the bot is in the chat; the alert is kept and retried",
				zap.Duration("retry_in", n.cfg.RejectedDelay), zap.Error(err))
			return time.Time{}, n.cfg.RejectedDelay, err
		}
		n.metrics.failed.WithLabelValues("unavailable").Inc()
		return time.Time{}, 0, err
	}
	n.metrics.sent.Inc()
	log.Info("alert sent")
	return sentAt, 0, n.markAlerted(op, log, &st.Job)
}

// markAlerted sets the Alerted marker of job, retrying until op ends: the
// message is out, and without the marker a later try would send it again.
func (n *Notifier) markAlerted(op context.Context, log *zap.Logger, job *proto.Job) error {
	for {
		_, err := n.status.Apply(op, job, status.MarkAlerted())
		switch {
		case err == nil:
			return nil
		case errors.Is(err, status.ErrAlerted):
			log.Warn("another notifier had alerted on this failure too")
			return nil
		case errors.Is(err, status.ErrNotFailed):
			// Not something a retry changes; the lifecycle keeps a
			// failed record failed, so this is a record written by hand.
			log.Error("could not record that the alert was sent", zap.Error(err))
			return nil
		case op.Err() != nil:
			log.Error("could not record that the alert was sent: it may be sent again", zap.Error(err))
			return fmt.Errorf("recording the alert marker: %w", err)
		}
		log.Warn("recording the alert marker, will retry", zap.Error(err))
		sleep(op, time.Second)
	}
}

// deadLetter copies the job to JOBS_DLQ, deduplicated by job id so that a
// repeat within the duplicate window is harmless, and returns its sequence
// there. (A repeat after the window is prevented by DLQSeq in the status
// record, written right after.)
func (n *Notifier) deadLetter(ctx context.Context, f *failure) (uint64, error) {
	m := nats.NewMsg(f.dlqSubject)
	m.Data = f.data
	m.Header.Set(proto.HeaderMsgID, "dlq-"+f.st.Job.ID)
	m.Header.Set(proto.HeaderDLQReason, f.reason)
	m.Header.Set(proto.HeaderDLQAttempts, strconv.Itoa(f.attempts))
	m.Header.Set(proto.HeaderDLQTime, time.Now().UTC().Format(time.RFC3339))
	ack, err := n.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, fmt.Errorf("publishing job %s to %s: %w", f.st.Job.ID, proto.StreamDLQ, err)
	}
	if !ack.Duplicate {
		n.metrics.deadLettered.Inc()
	}
	return ack.Sequence, nil
}

// removeJob deletes a dead-lettered job from JOBS. Only MAX_DELIVERIES
// leaves one there; Term removed it already.
func (n *Notifier) removeJob(ctx context.Context, adv *proto.Advisory) error {
	if adv.Type != proto.AdvisoryMaxDeliveries {
		return nil
	}
	stream, err := n.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return fmt.Errorf("looking up stream %s: %w", proto.StreamJobs, err)
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("removing job at seq %d from %s: %w", adv.StreamSeq, proto.StreamJobs, err)
	}
	return nil
}

// errHandled marks an advisory whose work is already done.
var errHandled = errors.New("advisory already handled")
