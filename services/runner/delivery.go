package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/prompt"
	"github.com/orch-dev/orch/services/runner/taskstate"
)

// handle runs one delivery of a job and settles its message. It returns
// the project whose spare worktree is to be made ready now that the job
// is done, nil when the job never reached its worktree (see consume).
func (r *Runner) handle(ctx context.Context, msg jetstream.Msg) (spareFor *registry.Project) {
	meta, err := msg.Metadata()
	if err != nil {
		r.log.Error("message without metadata", zap.Error(err))
		_ = msg.Term()
		return
	}
	// The attempt is the message's delivery count, after the attempts the
	// job used before it was held (its record's AttemptBase, read below).
	attempt := int(meta.NumDelivered)
	log := r.log.With(zap.Uint64("stream_seq", meta.Sequence.Stream))

	job, err := proto.DecodeJob(msg.Data())
	if job != nil && job.ID != "" {
		log = log.With(zap.String("job", job.ID))
	}
	// The job keeps this version of the registry to its end, whatever a
	// SIGHUP loads meanwhile.
	projs := r.projects.Load()
	var p *registry.Project
	if err == nil {
		var ok bool
		if p, ok = projs.reg.ByKey(job.Project); !ok {
			err = fmt.Errorf("unknown project %q", job.Project)
		}
	}
	if err != nil {
		if job == nil || job.ID == "" {
			// Nothing to key a record on: name it by its stream sequence.
			job = &proto.Job{ID: proto.UndecodableJobID(meta.Sequence.Stream), Kind: "unknown", Project: "unknown"}
		}
		job.Task.ID = cmp.Or(job.Task.ID, "unknown")
		r.settle(ctx, log.With(zap.Int("attempt", attempt)), msg, job, nil, attempt, outcome{end: cannotRun, exitCode: -1, err: err})
		return
	}
	log = log.With(zap.String("kind", string(job.Kind)), zap.String("project", job.Project), zap.String("task", job.Task.ID))

	// The agent's sandbox is made beside the reads, admission and the
	// worktree's checks, its agent held at its gate until run lets it
	// start (prestart.go). Most jobs' attempt is their delivery's: one
	// whose record says otherwise gets another sandbox.
	pre := r.prestart(ctx, log, job, p, attempt)
	defer pre.abort()
	// The record read here is also what the running state is written
	// over (see run), unless it changed meanwhile. What might hold the job
	// is read beside it, and the queue its admission judges by: none of
	// the reads waits for another.
	ahead := r.readAhead(ctx, lockKey(job))
	defer ahead.close()
	var (
		rec         record
		republished bool
		holdReason  string
		holdUntil   time.Time
		reading     sync.WaitGroup
	)
	reading.Go(func() { holdReason, holdUntil = r.holdFor(ctx, log, job, p) })
	st, rev, err := r.status.Get(ctx, job.ID)
	readAt := time.Now()
	reading.Wait()
	if err == nil {
		rec = record{st: st, rev: rev}
		base := st.AttemptBase
		if st.State == proto.StateHeld {
			// Published again before the release was recorded.
			base = st.Attempt
		}
		attempt += base
		republished = st.Holds > 0
	}
	log = log.With(zap.Int("attempt", attempt))
	// settleAs settles an outcome of this delivery.
	settleAs := func(out outcome) {
		out.republished = republished
		r.settle(ctx, log, msg, job, p, attempt, out)
	}
	if st := rec.st; st != nil {
		switch st.State {
		case proto.StateCancelled:
			settleAs(outcome{end: cancelledBeforeRun})
			return
		case proto.StateDone:
			settleAs(outcome{end: alreadyDone})
			return
		}
	}
	if attempt > r.cfg.MaxAttempts {
		// Only a job published again can get here: its message's
		// MaxDeliver counts from the attempts it had used.
		settleAs(unprepared(fmt.Errorf("no attempt left: %d of %d used", attempt-1, r.cfg.MaxAttempts)))
		return
	}
	if holdReason != "" && (rec.st == nil || rec.st.ReleasedBy == "") {
		// A job released by hand runs whatever holds it.
		settleAs(outcome{end: onHold, exitCode: -1, holdReason: holdReason, holdUntil: holdUntil})
		return
	}

	// Once the job is settled and its slot given back, the project's
	// spare worktree is made ready for its next new task (consume).
	spareFor = p

	// jobCtx ends the job early: cancel, lost lease or lock, shutdown.
	jobCtx, stopJob := context.WithCancelCause(ctx)
	defer stopJob(nil)
	// The heartbeat and the cancel watch outlive jobCtx: they run until
	// the job is settled.
	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var (
		bg         sync.WaitGroup
		slot, lock atomic.Pointer[taskLock]
	)
	bg.Go(func() { r.heartbeat(bgCtx, log, msg, []*atomic.Pointer[taskLock]{&slot, &lock}, stopJob) })
	bg.Go(func() { r.watchCancel(bgCtx, log, job.ID, stopJob) })
	defer func() {
		stopBG()
		bg.Wait()
		for _, held := range []*atomic.Pointer[taskLock]{&lock, &slot} {
			if l := held.Load(); l != nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
				if err := l.release(rctx); err != nil {
					log.Warn("releasing", zap.String("key", l.key), zap.Error(err))
				}
				cancel()
				r.changed()
			}
		}
	}()

	// The project's slot first, the task lock beside it when the slot is
	// free (fairness.go): a job waiting for its slot holds no task lock
	// another job of the task could use.
	l, err := r.taskLockOf(job, attempt)
	if err != nil {
		settleAs(unprepared(err))
		return
	}
	s, took, err := r.admit(jobCtx, log, msg, meta, job, p, projs, attempt, l, ahead)
	if errors.Is(err, errDeferred) {
		return
	}
	if err != nil {
		r.settle(ctx, log, msg, job, p, attempt, unprepared(err))
		return
	}
	slot.Store(s)
	if !took {
		if err := r.acquireLock(jobCtx, log, l); err != nil {
			settleAs(unprepared(err))
			return
		}
	}
	lock.Store(l)
	// Another runner can have been given the job and run it meanwhile
	// only if this one held it for AckWait; before that, a job that
	// waited for its task's lock waited for another job of the task.
	// Held counts from the delivery, by the server's clock, as well as
	// from the record's read: a runner starved of CPU between the two
	// (a loaded host) read a record another runner's run may since have
	// ended.
	held := max(time.Since(readAt), time.Since(meta.Timestamp))
	rec.stale = !took || held > r.cfg.AckWait/2
	began := time.Now()
	out := r.run(jobCtx, log, job, p, projs.tmpls, attempt, rec, pre)
	out.began = began
	settleAs(out)
	return p
}

// record is a job's status record as read, and its revision; a nil st
// when it could not be read. stale says it may say something else by the
// time the job runs (the job waited for its task's lock, or long enough
// to have been redelivered to another runner): run then lets the agent
// start only once the running state is written over it.
type record struct {
	st    *proto.Status
	rev   uint64
	stale bool
}

// run records the job as running, prepares the worktree and runs the
// agent (or, for a cleanup, removes the worktree). p and tmpls are of the
// registry version the job started with; rec is the job's record as read
// when the job began, which the running state is written over unless it
// changed since. pre is the agent's sandbox made ahead, if any.
func (r *Runner) run(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, tmpls *prompt.Templates, attempt int, rec record, pre *prestart) (out outcome) {
	logPath := r.ws.LogPath(job.ID, attempt)
	if job.Kind == proto.KindCleanup {
		logPath = ""
	}
	logField := ""
	if *r.cfg.LogLocal {
		logField = logPath
	}
	// The running state, the worktree and the agent's start do not
	// depend on each other, so the record is written while the worktree
	// is prepared, the task's saved state carried into it and the agent
	// started. A record that turns out to say the job is not to run
	// (cancelled, superseded or done since it was read) stops the agent
	// at once, as a cancel arriving just after the write would, and the
	// job ends as the record says (the task lock is held, so no other job
	// is in the worktree meanwhile). A stale record (see record) is
	// written over first.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	w := r.writeRunning(ctx, log, job, rec, attempt, logField, stop)
	defer func() {
		if o, refused := w.refused(); refused {
			out = o
		}
	}()
	if job.Kind == proto.KindCleanup || rec.stale {
		if _, refused := w.refused(); refused {
			return outcome{} // the deferred check sets it
		}
	}
	if job.Kind == proto.KindCleanup {
		log.Info("removing the task's worktree")
		if err := r.ws.Remove(ctx, job.Project, job.Task.ID, job.Task.PR); err != nil {
			return outcome{end: ranToEnd, exitCode: -1, err: err}
		}
		// What an agent left in the task's home may resist removal (a
		// directory it made unwritable): the task is over either way.
		if err := os.RemoveAll(r.homePath(job)); err != nil {
			log.Warn("removing the task's home", zap.Error(err))
		}
		r.dropState(ctx, log, job)
		r.sessions.Delete(lockKey(job))
		return outcome{end: ranToEnd}
	}

	// A preparation the runner stopped (cancel, shutdown, lost lease)
	// ends as that stop, not as a failure of the job's.
	fail := func(err error) outcome {
		if cause := context.Cause(ctx); cause != nil {
			err = cause
		}
		return unprepared(err)
	}
	// The task's saved state is looked up while the worktree is checked.
	var (
		found   taskstate.Found
		looking sync.WaitGroup
	)
	if r.state != nil {
		looking.Go(func() { found = r.state.Lookup(ctx, job.Project, job.Task.ID) })
	}
	co, err := r.prepareTimed(ctx, log, job, p, attempt)
	looking.Wait()
	if err != nil {
		return fail(fmt.Errorf("preparing worktree: %w", err))
	}
	cs := r.carryIn(ctx, log, job, p, attempt, &co, found)
	dir := co.Dir
	text, err := tmpls.Render(promptData(job, attempt, r.cfg.MaxAttempts, co))
	if err != nil {
		return fail(err)
	}
	taskFile, err := r.ws.TaskFile(dir, job.ID, text)
	if err != nil {
		return fail(err)
	}
	// Claude Code's own limit is the least of the job's max_cost_usd and
	// what is left of the project's budget (budgetCap); the runner stops
	// any agent past the job's max_cost_usd (capUSD). spent is what the
	// agent's output showed spent, over the runs of this attempt.
	capUSD, budgetCap := p.MaxCostUSD.For(string(job.Kind)), pre.budget()
	if budgetCap < 0 {
		budgetCap = r.jobCap(ctx, job, p)
	}
	var (
		spent float64
		// proxyLimit is the reset of a usage limit the egress proxy saw
		// (a 429 with a long retry-after).
		proxyLimit time.Time
	)
	left := func(limit float64) float64 {
		if limit <= 0 {
			return 0
		}
		// A run after one that spent it all still has a limit, a tiny one.
		return max(limit-spent, min(limit, 0.0001))
	}
	// start runs the agent once, resuming session ("" for a fresh one):
	// a resume the agent refuses runs again (see runCarried).
	start := func(session string) (agent.Result, []string, string, error) {
		spec := r.agentSpec(job, p, attempt, dir, taskFile, logPath, session, left(budgetCap))
		argv := spec.Argv
		spec, stopConfine, ok := pre.take(log, spec)
		if !ok {
			var (
				listen func() error
				err    error
			)
			if stopConfine, listen, err = r.confine(log, job, p, dir, nil, &spec); err != nil {
				return agent.Result{}, argv, logPath, err
			}
			if err = listen(); err != nil {
				stopConfine()
				return agent.Result{}, argv, logPath, err
			}
		}
		defer stopConfine()
		spec.Stdin = text
		log.Info("agent starting", zap.String("dir", dir), zap.String("log", logPath), zap.String("sandbox", r.conf.sandboxName()),
			zap.Bool("sandbox_ahead", ok), zap.String("resume", session))
		res, more, err := r.runAgent(ctx, log, job, attempt, spec, left(capUSD), p.MaxTurns)
		spent += more
		if u, ok := r.metered(job.ID); ok {
			proxyLimit = meteredLimit(u)
		}
		return res, argv, logPath, err
	}
	res, argv, err := r.runCarried(ctx, log, job, &cs, start)
	if _, refused := w.refused(); refused {
		// Not this runner's to run: nothing of the stopped agent's is
		// kept, not even the task's state (another runner's may be the
		// last).
		return outcome{} // the deferred check sets it
	}
	if err != nil {
		return fail(err)
	}
	c, err := agent.ParseClaudeResultFile(logPath)
	session := ""
	if c != nil {
		session = c.SessionID
	}
	r.saveState(ctx, log, &cs, session, "end")
	r.sessions.Store(lockKey(job), session)
	switch {
	case err != nil:
		log.Warn("reading agent result", zap.Error(err))
	case c != nil:
		res = c.Judge(res)
	case agent.IsClaude(argv):
		res = agent.JudgeWithoutResult(res, logPath)
	}
	res = r.conf.judgeLimits(res, logPath)
	switch {
	case c == nil || res.Err == nil:
	case c.Subtype == agent.ClaudeMaxBudgetSubtype:
		// Claude Code stopped at its --max-budget-usd: the job's cap.
		res.Err = fmt.Errorf("%w: Claude Code stopped at its budget of %s (%v)", errOverBudget, usd(budgetCap), res.Err)
	case c.Subtype == agent.ClaudeMaxTurnsSubtype && p.MaxTurns > 0:
		res.Err = fmt.Errorf("%w: Claude Code stopped at max_turns %d (%v)", errMaxTurns, p.MaxTurns, res.Err)
	}
	limited := r.usageLimit(log, res, logPath)
	if _, stopped := stopEnding(res.Err); limited == nil && !proxyLimit.IsZero() && res.Err != nil && !stopped {
		limited = &proxyLimit
	}
	r.dropLocalLog(log, logPath)
	out = ended(res, c)
	out.spent = spent
	out.resumed, out.restored = cs.resumed, cs.restored
	if limited != nil {
		out.end, out.holdReason, out.holdUntil = usageLimited, proto.HoldUsageLimit, *limited
	}
	return out
}

// usageLimit is when the account's usage limit that stopped the agent
// resets, read from its output (Claude Code's rejected rate_limit_event
// or its "limit · resets" result), usagePauseDefault ahead when it does
// not say; nil when the agent did not fail for a usage limit.
func (r *Runner) usageLimit(log *zap.Logger, res agent.Result, logPath string) *time.Time {
	if res.Err == nil {
		return nil
	}
	if _, stopped := stopEnding(res.Err); stopped || errors.Is(res.Err, errOverBudget) {
		return nil
	}
	now := time.Now()
	u, err := agent.ParseUsageLimitFile(logPath, now)
	if err != nil {
		log.Debug("reading the agent's output for a usage limit", zap.Error(err))
	}
	if !u.Hit {
		return nil
	}
	at := u.ResetsAt
	if !at.After(now) {
		at = now.Add(usagePauseDefault)
		if !u.ResetsAt.IsZero() {
			// A reset in the past: the clocks differ; try again soon.
			at = now.Add(releaseInterval)
		}
	}
	return &at
}
