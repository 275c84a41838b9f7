package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/prompt"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// The causes that end a job other than its agent's own exit.
var (
	// errShutdown: the runner is shutting down; the job is handed back.
	errShutdown = errors.New("runner shutting down")
	// errCancelled: the job's record turned cancelled.
	errCancelled = errors.New(proto.ReasonCancelled)
	// errSuperseded: the record shows a later delivery of the job, which
	// went to another runner while this one was cut off.
	errSuperseded = errors.New("job superseded by a later delivery")
	// errAlreadyDone: the record says done; a success was redelivered.
	errAlreadyDone = errors.New("job already done")
)

// handle runs one delivery of a job and settles its message.
func (r *Runner) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		r.log.Error("message without metadata", zap.Error(err))
		_ = msg.Term()
		return
	}
	attempt := int(meta.NumDelivered)
	log := r.log.With(zap.Uint64("stream_seq", meta.Sequence.Stream), zap.Int("attempt", attempt))

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
		r.terminate(ctx, log, msg, job, attempt, err)
		return
	}
	log = log.With(zap.String("kind", string(job.Kind)), zap.String("project", job.Project), zap.String("task", job.Task.ID))

	// The record read here is also what the running state is written
	// over (see run), unless it changed meanwhile.
	var rec record
	if st, rev, err := r.status.Get(ctx, job.ID); err == nil {
		rec = record{st, rev}
		switch st.State {
		case proto.StateCancelled:
			log.Info("job was cancelled before it ran: skipping")
			_ = msg.TermWithReason(proto.ReasonCancelled)
			r.metrics.settled(job, outcome{}, outcomeCancelled)
			return
		case proto.StateDone:
			r.settle(ctx, log, msg, job, p, attempt, outcome{res: agent.Result{Err: errAlreadyDone}})
			return
		}
	}

	// jobCtx ends the job early: cancel, lost lease or lock, shutdown.
	jobCtx, stopJob := context.WithCancelCause(ctx)
	defer stopJob(nil)
	// The heartbeat and the cancel watch outlive jobCtx: they run until
	// the job is settled.
	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var (
		bg   sync.WaitGroup
		lock atomic.Pointer[taskLock]
	)
	bg.Go(func() { r.heartbeat(bgCtx, log, msg, &lock, stopJob) })
	bg.Go(func() { r.watchCancel(bgCtx, log, job.ID, stopJob) })
	defer func() {
		stopBG()
		bg.Wait()
		if l := lock.Load(); l != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
			if err := l.release(rctx); err != nil {
				log.Warn("releasing task lock", zap.Error(err))
			}
			cancel()
		}
	}()

	l, err := r.acquireLock(jobCtx, log, job, attempt)
	if err != nil {
		r.settle(ctx, log, msg, job, p, attempt, outcome{res: agent.Result{ExitCode: -1, Err: err}})
		return
	}
	lock.Store(l)
	began := time.Now()
	out := r.run(jobCtx, log, job, p, projs.tmpls, attempt, rec)
	out.began = began
	r.settle(ctx, log, msg, job, p, attempt, out)
}

// outcome is how one attempt ended.
type outcome struct {
	res agent.Result
	// claude is Claude Code's result object, when the agent printed one.
	claude *agent.ClaudeResult
	log    string
	// began is when the attempt started running, once it did.
	began time.Time
}

// record is a job's status record as read, and its revision; a nil st
// when it could not be read.
type record struct {
	st  *proto.Status
	rev uint64
}

// run records the job as running, prepares the worktree and runs the
// agent (or, for a cleanup, removes the worktree). p and tmpls are of the
// registry version the job started with; rec is the job's record as read
// when the job began, which the running state is written over unless it
// changed since.
func (r *Runner) run(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, tmpls *prompt.Templates, attempt int, rec record) outcome {
	logPath := r.ws.LogPath(job.ID, attempt)
	if job.Kind == proto.KindCleanup {
		logPath = ""
	}
	logField := ""
	if *r.cfg.LogLocal {
		logField = logPath
	}
	// The running state and the worktree do not depend on each other, so
	// the worktree is prepared while the record is written; it is simply
	// not used when the record says the job is not to run (the task lock
	// is held, so no other job is in the worktree meanwhile).
	var (
		co        workspace.Checkout
		coErr     error
		preparing sync.WaitGroup
	)
	if job.Kind != proto.KindCleanup {
		preparing.Go(func() { co, coErr = r.prepareTimed(ctx, log, job, p, attempt) })
	}
	st, err := r.status.ApplyFrom(ctx, job, rec.st, rec.rev, status.StartAttempt(attempt, r.cfg.MaxAttempts, r.cfg.Name, logField, time.Now().UTC()))
	preparing.Wait()
	switch {
	case errors.Is(err, status.ErrTerminal) && st.State == proto.StateCancelled:
		return outcome{res: agent.Result{ExitCode: -1, Err: errCancelled}}
	case errors.Is(err, status.ErrTerminal) && st.State == proto.StateDone:
		return outcome{res: agent.Result{Err: errAlreadyDone}}
	case errors.Is(err, status.ErrTerminal), errors.Is(err, status.ErrSuperseded):
		return outcome{res: agent.Result{ExitCode: -1, Err: errSuperseded}}
	case err != nil:
		// Status is bookkeeping: a KV hiccup does not stop the job.
		log.Warn("recording running state", zap.Error(err))
	}
	r.metrics.started(job, attempt)

	if job.Kind == proto.KindCleanup {
		log.Info("removing the task's worktree")
		if err := r.ws.Remove(ctx, job.Project, job.Task.ID, job.Task.PR); err != nil {
			return outcome{res: agent.Result{ExitCode: -1, Err: err}}
		}
		return outcome{}
	}

	fail := func(err error) outcome { return outcome{res: agent.Result{ExitCode: -1, Err: err}, log: logPath} }
	if coErr != nil {
		return fail(fmt.Errorf("preparing worktree: %w", coErr))
	}
	dir := co.Dir
	text, err := tmpls.Render(promptData(job, attempt, r.cfg.MaxAttempts, co))
	if err != nil {
		return fail(err)
	}
	taskFile, err := r.ws.TaskFile(dir, job.ID, text)
	if err != nil {
		return fail(err)
	}
	argv, agentEnv := r.agentCommand(p, job.Kind)
	spec := agent.Spec{
		Argv: argv, Dir: dir, Stdin: text, LogPath: logPath,
		Timeout:   cmp.Or(p.AgentTimeout, r.cfg.AgentTimeout),
		KillGrace: r.cfg.KillGrace,
		Env: agent.Env(r.envAllow,
			append(agentEnv, "ORCH_JOB_ID="+job.ID, "ORCH_ATTEMPT="+strconv.Itoa(attempt), "ORCH_KIND="+string(job.Kind),
				"ORCH_PROJECT="+job.Project, "ORCH_TASK="+job.Task.ID, "ORCH_TASK_FILE="+taskFile)...),
	}
	log.Info("agent starting", zap.String("dir", dir), zap.String("log", logPath))
	out := outcome{res: r.runAgent(ctx, log, job, attempt, spec), log: logPath}
	if c, err := agent.ParseClaudeResultFile(logPath); err != nil {
		log.Warn("reading agent result", zap.Error(err))
	} else if c != nil {
		out.claude = c
		out.res = c.Judge(out.res)
	} else if agent.IsClaude(argv) {
		out.res = agent.JudgeWithoutResult(out.res, logPath)
	}
	r.dropLocalLog(log, logPath)
	return out
}

// terminate ends a job that can never run. Term removes it from the
// WorkQueue stream at once, so what is known of it goes to KV first: the
// notifier reads it from there.
func (r *Runner) terminate(ctx context.Context, log *zap.Logger, msg jetstream.Msg, job *proto.Job, attempt int, cause error) {
	log.Error("terminating job that cannot run", zap.Error(cause))
	if job == nil || job.ID == "" {
		// Nothing to key a record on: name it by its stream sequence.
		meta, _ := msg.Metadata()
		job = &proto.Job{ID: "seq-" + strconv.FormatUint(meta.Sequence.Stream, 10), Kind: "unknown", Project: "unknown"}
	}
	job.Task.ID = cmp.Or(job.Task.ID, "unknown")
	_, err := r.status.Apply(ctx, job, status.Reject(attempt, r.cfg.MaxAttempts, r.cfg.Name, cause.Error(), time.Now().UTC()))
	if err != nil {
		log.Error("recording terminated job", zap.Error(err))
	}
	if err := msg.TermWithReason(proto.TermReason(job.ID, cause.Error())); err != nil {
		log.Error("terminating message", zap.Error(err))
	}
	r.metrics.settled(job, outcome{}, outcomeFailed)
}
