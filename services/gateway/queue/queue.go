// Package queue carries out trigger decisions: it puts jobs on the JOBS
// stream and cancels a task's open jobs, or, while JetStream is away,
// keeps the decision in the spool and carries it out when it is back.
//
// A job counts as queued only once JetStream has acked it, and the publish
// is the one durable write on a webhook's path: the job's status record
// is created by the runner that takes it, by a cancel or a supersede that
// comes first, or by the gateway once the job has waited a second
// (RecordWaiting), and the gateway's index knows the job from JOBS until
// then (index.Index.Queued, FollowJobs). Each job is published at most
// once per dedupe key: JetStream's duplicate window catches quick
// repeats, the index (the job in JOBS, or its record) and the dedupe
// memory (a key kept for ORCH_DEDUPE_TTL once the job's record exists,
// see Dedupe) catch the rest, also after a JetStream restart, when the
// window has forgotten acked messages, and after the record expired.
//
// Nothing one event carries can stop the queue: a job is cut to fit
// ORCH_MAX_TASK_BYTES before it is published (Fit), and a decision that
// fails for a reason retrying cannot fix (ErrPermanent) is never spooled,
// and leaves the spool for its quarantine when it is found there.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/metrics"
	"github.com/orch-dev/orch/services/gateway/spool"
	"github.com/orch-dev/orch/services/gateway/trigger"
)

// Timing of Apply. Gitea gives up on a webhook after 5 s, so retries and
// the spool write must fit well inside that.
const (
	// RetryBudget is how long Apply keeps trying JetStream before it
	// spools the decision.
	RetryBudget = 2 * time.Second
	// AttemptTimeout bounds one attempt.
	AttemptTimeout = time.Second
	// RetryPause is the pause between attempts.
	RetryPause = 200 * time.Millisecond
)

// ErrUnavailable is returned while JetStream cannot be used (not
// connected yet, or disconnected), and by CancelTask while the job index
// has not read the bucket yet.
var ErrUnavailable = errors.New("jetstream unavailable")

// ErrPermanent marks a failure that trying again cannot fix: the job is
// not valid, does not encode, or does not fit even with its text cut, or
// JetStream refused the message itself (see Permanent). Such a decision
// is answered with an error, never spooled; found in the spool, it is
// quarantined.
var ErrPermanent = errors.New("cannot be queued")

// Permanent reports whether err is a failure that trying again cannot
// fix: ErrPermanent, NATS refusing a message over the server's max
// payload, or JetStream refusing the message for its size or its headers
// (codes 10054 and 10097). Everything else (timeouts, no responders, a
// cluster without a leader, a full stream, KV conflicts) may pass and is
// tried again.
func Permanent(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, ErrPermanent), errors.Is(err, nats.ErrMaxPayload):
		return true
	case errors.As(err, &apiErr):
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum || apiErr.ErrorCode == jsErrCodeHeaderExceedsMaximum
	}
	return false
}

// jsErrCodeHeaderExceedsMaximum is JetStream's answer to a message whose
// headers are over 64 KiB (nats.go names no constant for it).
const jsErrCodeHeaderExceedsMaximum jetstream.ErrorCode = 10097

// Tasks finds the open jobs of a task and the jobs the gateway knows:
// the gateway's index.Index, a KV-watched copy of the status bucket with
// the jobs JOBS holds that have no record yet.
type Tasks interface {
	OpenJobs(project, task string) []string
	OlderOpenJobs(project, task string, kind proto.Kind, before time.Time) []string
	Has(id string) bool
	Synced() bool
	// Queued adds a job JetStream acked at sequence seq of JOBS.
	Queued(job *proto.Job, seq uint64)
	// Waiting returns the JOBS sequence of a job that has no record.
	Waiting(id string) (uint64, bool)
	// WaitingFor returns the jobs that have had no record for d.
	WaitingFor(d time.Duration) map[string]uint64
}

// Config is how the queue bounds and dedupes jobs.
type Config struct {
	// MaxTaskBytes bounds a published job; its text is cut to fit (see
	// Fit). Zero means MaxTaskBytesDefault.
	MaxTaskBytes int
	// RecordAfter is how long a job waits in JOBS without a status
	// record before the gateway creates it (see RecordWaiting). Zero
	// means RecordAfterDefault.
	RecordAfter time.Duration
	// SupersedeRunning says whether a newer job of a project's task and
	// kind also stops a running older one (registry supersede: running);
	// nil: never (supersede: queued, the default). See supersede.go.
	SupersedeRunning func(project string) bool
}

// Queue carries out decisions. Connect must be called once JetStream is
// reachable; until then every decision is spooled.
type Queue struct {
	log     *zap.Logger
	spool   *spool.Spool
	tasks   Tasks
	metrics *metrics.Metrics
	cfg     Config
	conn    atomic.Pointer[conn]
	// superseding tracks the supersedes that follow publishes.
	superseding inflight
	// published keeps the jobs published last (recent.go).
	published recent
}

type conn struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	status *status.Store
	dedupe *Dedupe
	// syncBy ends Enqueue's wait for the index (see synced).
	syncBy time.Time
}

// New returns a Queue that spools to sp and finds open jobs in tasks.
func New(sp *spool.Spool, tasks Tasks, m *metrics.Metrics, cfg Config, log *zap.Logger) *Queue {
	if cfg.MaxTaskBytes <= 0 {
		cfg.MaxTaskBytes = MaxTaskBytesDefault
	}
	if cfg.RecordAfter <= 0 {
		cfg.RecordAfter = RecordAfterDefault
	}
	return &Queue{log: log, spool: sp, tasks: tasks, metrics: m, cfg: cfg}
}

// Connect makes JetStream available to the queue and wakes the spool.
// dd is the dedupe memory, watched by its owner.
func (q *Queue) Connect(nc *nats.Conn, js jetstream.JetStream, st *status.Store, dd *Dedupe) {
	q.conn.Store(&conn{nc: nc, js: js, status: st, dedupe: dd, syncBy: time.Now().Add(syncWait)})
	q.spool.Kick()
}

// SpoolDepth is the number of decisions waiting in the spool.
func (q *Queue) SpoolDepth() int { return q.spool.Depth() }

// SpoolOldestAge is how long the oldest decision in the spool has waited
// (zero when it is empty).
func (q *Queue) SpoolOldestAge() time.Duration { return q.spool.OldestAge() }

func (q *Queue) ready() (*conn, error) {
	c := q.conn.Load()
	switch {
	case c == nil:
		return nil, fmt.Errorf("%w: not connected yet", ErrUnavailable)
	case c.nc.Status() != nats.CONNECTED:
		return nil, fmt.Errorf("%w: nats %s", ErrUnavailable, c.nc.Status())
	}
	return c, nil
}

// Result says what Enqueue did with one job.
type Result struct {
	// Duplicate is set when the job was already known and not published.
	Duplicate bool
}

// Enqueue publishes job unless it is already known. It returns only
// once JetStream holds the job, which the index then knows (Queued).
//
// A job is known when the index holds it: its status record, or the job
// in JOBS (read at start and followed, see index.FollowJobs; this
// gateway's own publishes are added at their ack). Both are read without
// a round trip. A job the index has not caught up with yet (published by
// another gateway a moment ago) belongs to a publish that JetStream's
// duplicate window still remembers: the publish below is dropped as a
// duplicate. A job whose record has expired is still known by its dedupe
// key (see Dedupe, also read without a round trip).
//
// Before the publish the job is validated and cut to fit MaxTaskBytes.
// The publish is the only write on the caller's path, and the only
// durable write at all for a job a runner takes within a second (see
// RecordWaiting) that supersedes nothing (see supersede, done right
// after, off the caller's path).
func (q *Queue) Enqueue(ctx context.Context, job *proto.Job) (Result, error) {
	c, err := q.ready()
	if err != nil {
		return Result{}, err
	}
	q.synced(ctx, c)
	if q.tasks.Has(job.ID) {
		return Result{Duplicate: true}, nil
	}
	if known, err := c.dedupe.Published(ctx, job.ID); err != nil {
		return Result{}, fmt.Errorf("reading dedupe key of job %s: %w", job.ID, err)
	} else if known {
		return Result{Duplicate: true}, nil
	}
	if err := q.prepare(job); err != nil {
		return Result{}, err
	}
	data, err := json.Marshal(job)
	if err != nil {
		return Result{}, fmt.Errorf("%w: encoding job %s: %v", ErrPermanent, job.ID, err)
	}
	start := time.Now()
	ack, err := c.js.Publish(ctx, proto.JobSubject(job.Project, job.Kind), data, jetstream.WithMsgID(job.ID))
	if err != nil {
		return Result{}, fmt.Errorf("publishing job %s: %w", job.ID, err)
	}
	q.metrics.ObservePublish(start)
	q.tasks.Queued(job, ack.Sequence)
	if !ack.Duplicate {
		// JOBS holds this job as encoded here (a duplicate's is the
		// first publish's).
		q.published.add(job, len(data))
		if q.supersedes(job) {
			q.superseding.write(job.ID, func() { q.supersede(c, job) })
		}
	}
	return Result{Duplicate: ack.Duplicate}, nil
}

// syncWait bounds how long after Connect Enqueue waits for the index to
// have read the status bucket and JOBS.
const syncWait = 2 * time.Second

// synced waits until the index has read the status bucket and JOBS, but
// not past syncWait after Connect: before that, a job that waits in JOBS
// for longer than JetStream's duplicate window would not be known, and
// its event, sent again, would queue it twice. Past it the publish goes
// ahead with the window alone to dedupe it (the index cannot read JOBS:
// its warnings say why).
func (q *Queue) synced(ctx context.Context, c *conn) {
	if q.tasks.Synced() {
		return
	}
	ctx, cancel := context.WithDeadline(ctx, c.syncBy)
	defer cancel()
	for !q.tasks.Synced() && backoff.Sleep(ctx, 10*time.Millisecond) {
	}
}

// current returns the record of job id and its revision, or, for a job
// that JOBS holds without one, the job as an absent record (revision 0),
// which a transition may create.
//
// The index says which to read first. A record created after it was read
// is found by the transition's compare-and-set, which then reads it. A
// waiting job this gateway published lately is not read at all (recent).
func (q *Queue) current(ctx context.Context, c *conn, id string) (*proto.Status, uint64, error) {
	if seq, ok := q.tasks.Waiting(id); ok {
		if job, ok := q.published.get(id); ok {
			return &proto.Status{Job: *job}, 0, nil
		}
		job, ok, err := index.JobAt(ctx, c.nc, seq)
		if err != nil {
			return nil, 0, err
		}
		if ok {
			return &proto.Status{Job: *job}, 0, nil
		}
		// Taken meanwhile: its record is written.
	}
	return c.status.Get(ctx, id)
}

// Job returns the status record of job id, or, for a job waiting in JOBS
// with none yet, the job as queued. It returns status.ErrNotFound for a
// job the gateway does not know.
//
// Unlike a transition's read (current), it reads the record first: the
// index learns of records through a watch, so it may still call waiting
// a job whose record was written just now (by this gateway's cancel, or
// a runner that took it), and a read must see that write. A transition
// needs no such read: its compare-and-set finds the record. With no
// record, it reads as current does, whatever the index said before: a
// runner may have written the record, and the watch removed the job from
// the waiting ones, after the first read.
func (q *Queue) Job(ctx context.Context, id string) (*proto.Status, error) {
	c, err := q.ready()
	if err != nil {
		return nil, err
	}
	q.Settle(ctx, id)
	st, rev, err := c.status.Get(ctx, id)
	if errors.Is(err, status.ErrNotFound) {
		st, rev, err = q.current(ctx, c, id)
	}
	if err != nil {
		return nil, err
	}
	if rev == 0 {
		st.Schema, st.State, st.UpdatedAt = proto.SchemaVersion, proto.StateQueued, st.Job.CreatedAt
	}
	return st, nil
}

// settled is current of job id once the supersede that follows its
// publish by this gateway is done (Settle).
func (q *Queue) settled(ctx context.Context, id string) (*conn, *proto.Status, uint64, error) {
	c, err := q.ready()
	if err != nil {
		return nil, nil, 0, err
	}
	q.Settle(ctx, id)
	st, rev, err := q.current(ctx, c, id)
	return c, st, rev, err
}

// Settle waits until the supersede that follows the publish of job id by
// this gateway is done (at once when there is none), so that a read of
// an older job right after a newer one's 202 finds it superseded. It
// returns early when ctx ends.
func (q *Queue) Settle(ctx context.Context, id string) { q.superseding.wait(ctx, id) }

// SettleAll is Settle for every supersede in flight now, so that a list
// read right after a 202 shows the jobs it superseded.
func (q *Queue) SettleAll(ctx context.Context) { q.superseding.waitAll(ctx) }

// Wait waits for the supersedes that follow publishes: the gateway calls
// it once its HTTP server and spool have stopped, before it closes NATS.
func (q *Queue) Wait() { q.superseding.wg.Wait() }

// prepare makes job ready to publish: valid, and cut to fit MaxTaskBytes
// (see Fit). Its error is ErrPermanent. A job prepared once is left as
// it is.
func (q *Queue) prepare(job *proto.Job) error {
	if err := job.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrPermanent, err)
	}
	size := len(job.Task.Body) + len(job.Trigger) + len(job.Task.Title)
	cut, err := Fit(job, q.cfg.MaxTaskBytes)
	if err != nil {
		return err
	}
	if cut > 0 {
		q.metrics.JobsCut.Inc()
		q.log.Info("job text cut to fit ORCH_MAX_TASK_BYTES", zap.String("job", job.ID), zap.Int("cut_bytes", cut),
			zap.Int("text_bytes", size), zap.Int("max_task_bytes", q.cfg.MaxTaskBytes))
	}
	return nil
}

// Cancel marks job id cancelled (the runners skip or stop it), creating
// the record of a job that waits in JOBS without one. It returns
// status.ErrNotFound or status.ErrTerminal where they apply.
func (q *Queue) Cancel(ctx context.Context, id string) (*proto.Status, error) {
	c, st, rev, err := q.settled(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.status.ApplyFrom(ctx, &st.Job, st, rev, status.Cancel())
}

// CancelTask cancels every open job of a task and returns their ids.
func (q *Queue) CancelTask(ctx context.Context, project, task string) ([]string, error) {
	if _, err := q.ready(); err != nil {
		return nil, err
	}
	if !q.tasks.Synced() {
		// Only the index knows a task's jobs.
		return nil, fmt.Errorf("%w: job index not read yet", ErrUnavailable)
	}
	var done []string
	for _, id := range q.tasks.OpenJobs(project, task) {
		_, err := q.Cancel(ctx, id)
		if errors.Is(err, status.ErrTerminal) || errors.Is(err, status.ErrNotFound) {
			continue // ended meanwhile; nothing left to stop
		}
		if err != nil {
			return done, fmt.Errorf("cancelling job %s: %w", id, err)
		}
		q.log.Info("job cancelled", zap.String("job", id), zap.String("project", project), zap.String("task", task))
		done = append(done, id)
	}
	return done, nil
}

// Do carries out d now: the cancel first, then the jobs. Doing it twice is
// harmless, so a failed Do may simply be repeated. seen, when not nil, is
// called for each job JetStream holds, saying whether it already existed.
// A job that fails for good (Permanent) does not stop the jobs after it:
// their errors are returned once the rest is done.
func (q *Queue) Do(ctx context.Context, d trigger.Decision, log *zap.Logger, seen func(id string, duplicate bool)) error {
	if d.Cancel != nil {
		ids, err := q.CancelTask(ctx, d.Cancel.Project, d.Cancel.Task)
		if err != nil {
			return err
		}
		log.Info("task cancelled", zap.String("project", d.Cancel.Project), zap.String("task", d.Cancel.Task),
			zap.Strings("jobs", ids), zap.String("reason", d.Cancel.Reason))
	}
	var failed []error
	for i := range d.Jobs {
		job := &d.Jobs[i]
		res, err := q.Enqueue(ctx, job)
		if Permanent(err) {
			log.Warn("job cannot be queued, ever", zap.String("job", job.ID), zap.String("kind", string(job.Kind)),
				zap.String("project", job.Project), zap.String("delivery", job.Source.Delivery), zap.Error(err))
			failed = append(failed, err)
			continue
		}
		if err != nil {
			return err
		}
		log.Info("job queued", zap.String("job", job.ID), zap.String("kind", string(job.Kind)),
			zap.String("project", job.Project), zap.String("task", job.Task.ID), zap.Bool("duplicate", res.Duplicate),
			zap.String("delivery", job.Source.Delivery))
		if seen != nil {
			seen(job.ID, res.Duplicate)
		}
	}
	return errors.Join(failed...)
}

// Applied says what Apply did with a decision.
type Applied struct {
	// Spooled is set when the decision waits in the spool for JetStream.
	Spooled bool
	// Duplicate holds the ids of the decision's jobs that existed before
	// this delivery (a repeated event): they were not queued again. It is
	// empty for a spooled decision, whose jobs are not looked at yet.
	Duplicate map[string]bool
}

// Apply carries out d for a webhook: now if JetStream answers within
// RetryBudget, else in the spool. While the spool holds anything, d joins
// it, so events are carried out in the order they arrived. An error means
// d could be neither carried out nor spooled; it is Permanent when a job
// of d can never be queued, which no spool would change. Every job is
// prepared (validated, cut to fit) first, so the spool holds jobs as they
// will be published, and a decision with a job that can never be queued
// is refused whole, nothing of it carried out or spooled.
func (q *Queue) Apply(ctx context.Context, source, event string, d trigger.Decision, log *zap.Logger) (Applied, error) {
	for i := range d.Jobs {
		if err := q.prepare(&d.Jobs[i]); err != nil {
			return Applied{}, err
		}
	}
	var err error
	if q.spool.Depth() == 0 {
		// Across attempts, the first answer for a job counts: a job this
		// delivery queued before a later job failed is not a duplicate
		// when the retry finds it.
		dup := map[string]bool{}
		seen := func(id string, duplicate bool) {
			if _, ok := dup[id]; !ok {
				dup[id] = duplicate
			}
		}
		deadline := time.Now().Add(RetryBudget)
		for {
			actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
			err = q.Do(actx, d, log, seen)
			cancel()
			if err == nil {
				for id, isDup := range dup {
					if !isDup {
						delete(dup, id)
					}
				}
				return Applied{Duplicate: dup}, nil
			}
			if Permanent(err) {
				return Applied{}, err
			}
			if errors.Is(err, ErrUnavailable) || time.Now().Add(RetryPause).After(deadline) || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(RetryPause):
			}
		}
		log.Warn("jetstream unavailable, spooling the event", zap.String("source", source), zap.String("event", event), zap.Error(err))
	}
	e := &spool.Entry{Source: source, Event: event, Cancel: d.Cancel, Jobs: d.Jobs, SpooledAt: time.Now().UTC()}
	seq, serr := q.spool.Append(e)
	if serr != nil {
		return Applied{}, errors.Join(err, serr)
	}
	for _, j := range d.Jobs {
		log.Info("job spooled", zap.String("job", j.ID), zap.Uint64("seq", seq), zap.String("kind", string(j.Kind)),
			zap.String("source", source), zap.String("event", event), zap.String("delivery", j.Source.Delivery))
	}
	if d.Cancel != nil {
		log.Info("task cancel spooled", zap.String("task", d.Cancel.Task), zap.Uint64("seq", seq),
			zap.String("source", source), zap.String("event", event))
	}
	return Applied{Spooled: true}, nil
}

// Drain carries out the spool, in order, until ctx ends. An entry that
// fails for good (Permanent) is handed back as spool.ErrPermanent, and the
// spool moves it to its quarantine: the entries behind it go on.
//
// Its waits between tries are spool.Run's, not kit/backoff's: the same
// short retry after every failure, ended early by a Kick (a new entry,
// JetStream connected). A doubling delay would save little (a failed try
// is one publish that fails fast) and would leave webhooks on the disk
// for up to its cap after JetStream is back, since a reconnect kicks
// nothing; and backoff.Sleep cannot end on a Kick.
func (q *Queue) Drain(ctx context.Context, retry time.Duration) {
	log := q.log.Named("spool")
	q.spool.Run(ctx, func(ctx context.Context, e *spool.Entry) error {
		elog := log.With(zap.Uint64("seq", e.Seq), zap.String("source", e.Source), zap.String("event", e.Event))
		actx, cancel := context.WithTimeout(ctx, 10*AttemptTimeout)
		defer cancel()
		if err := q.Do(actx, trigger.Decision{Cancel: e.Cancel, Jobs: e.Jobs}, elog, nil); err != nil {
			if Permanent(err) {
				return fmt.Errorf("%w: %w", spool.ErrPermanent, err)
			}
			return err
		}
		q.metrics.Drained.Inc()
		return nil
	}, retry, log)
}
