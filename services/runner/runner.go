// Package runner pulls jobs from JetStream and runs an agent for each, no
// more at once than the runner consumer's MaxAckPending allows across every
// runner, retrying failures with a growing delay until MaxDeliver.
//
// Each job runs in its task's git worktree (package workspace), holding
// the task's lock (lock.go) so no two jobs of a task share the worktree at
// once, under a heartbeat that is also a lease (lease.go): a runner that
// cannot reach JetStream for most of AckWait stops its agent, because the
// job is about to be handed to another runner. Every status write is a
// compare-and-set that never moves a record back from a terminal state or
// from a later attempt, so a runner that lost its job cannot overwrite what
// the runner that has it now wrote.
package runner

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/registry"
	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/proto/status"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/logstream"
	"github.com/orch-dev/orch/services/runner/prompt"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// Defaults of the runner's settings.
const (
	ProjectsFileDefault   = "projects.yaml"
	MaxConcurrencyDefault = 1
	MaxAttemptsDefault    = 3
	RetryDelayDefault     = 30 * time.Second
	RetryMaxDelayDefault  = 15 * time.Minute
	AgentCommandDefault   = "claude -p --output-format stream-json --verbose"
	AgentTimeoutDefault   = 60 * time.Minute
	ShutdownGraceDefault  = 30 * time.Second
	AckWaitDefault        = 30 * time.Second
	KillGraceDefault      = agent.KillGraceDefault
	LogBufferDefault      = logstream.BufferBytesDefault
)

// Config is the runner's configuration, read from ORCH_ variables.
type Config struct {
	service.Common
	// ProjectsFile is the project registry; SIGHUP reloads it and the
	// task templates it names. Default "projects.yaml".
	ProjectsFile string `env:"PROJECTS_FILE"`
	// MaxConcurrency is how many agents run at once across all runners.
	// Default 1.
	MaxConcurrency int `env:"MAX_CONCURRENCY"`
	// MaxAttempts is how many deliveries a job gets. Default 3.
	MaxAttempts int `env:"MAX_ATTEMPTS"`
	// RetryDelay is the first retry's delay; it doubles per attempt,
	// jittered, up to RetryMaxDelay. Defaults 30s and 15m.
	RetryDelay    time.Duration `env:"RETRY_DELAY"`
	RetryMaxDelay time.Duration `env:"RETRY_MAX_DELAY"`
	// AgentCommand is the agent's argv, split as a shell would but never
	// run by one. Default: Claude Code in print mode.
	AgentCommand string `env:"AGENT_COMMAND"`
	// AgentTimeout is the watchdog. Default 60m.
	AgentTimeout time.Duration `env:"AGENT_TIMEOUT"`
	// AgentEnv names more variables of the runner's environment to pass
	// to the agent, besides agent.EnvAllowDefault.
	AgentEnv []string `env:"AGENT_ENV"`
	// WorkspaceDir holds worktrees and logs. Default $ORCH_DATA_DIR/workspace.
	WorkspaceDir string `env:"WORKSPACE_DIR"`
	// ShutdownGrace is how long running agents may finish after SIGTERM.
	// Default 30s.
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE"`
	// AckWait is how long a job may go without a heartbeat before
	// JetStream hands it to another runner. Default 30s.
	AckWait time.Duration `env:"ACK_WAIT"`
	// Name identifies this runner in status records. Default: host name.
	Name string `env:"RUNNER_NAME"`
	// KillGrace is how long an agent's process group has between SIGTERM
	// and SIGKILL when it is stopped (watchdog, cancel, shutdown, lost
	// lease). Default 5s.
	KillGrace time.Duration `env:"AGENT_KILL_GRACE"`
	// HTTPAddr is where /healthz, /readyz and /metrics are served.
	// Read from the environment it defaults to HTTPAddrDefault (":8081");
	// a Config built in Go with it empty serves nothing, so that several
	// runners can share a process.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8081"`
	// Listener, when set, is served instead of HTTPAddr (tests).
	Listener net.Listener `env:"-"`
	// LogLocal keeps each attempt's output in a file under WorkspaceDir
	// after the attempt; off, the file only buffers the output while the
	// agent runs. JOBS_LOGS has the output either way. Default true.
	LogLocal *bool `env:"LOG_LOCAL"`
	// LogBuffer bounds the agent output a runner holds while JetStream
	// does not take it; what does not fit is dropped, and the log says
	// so. Default 8MiB.
	LogBuffer service.ByteSize `env:"LOG_BUFFER"`
}

// SetDefaults fills the zero fields with their defaults.
func (c *Config) SetDefaults() {
	c.Common.SetDefaults()
	c.ProjectsFile = cmp.Or(c.ProjectsFile, ProjectsFileDefault)
	c.MaxConcurrency = cmp.Or(c.MaxConcurrency, MaxConcurrencyDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.RetryDelay = cmp.Or(c.RetryDelay, RetryDelayDefault)
	c.RetryMaxDelay = cmp.Or(c.RetryMaxDelay, RetryMaxDelayDefault)
	c.AgentCommand = cmp.Or(c.AgentCommand, AgentCommandDefault)
	c.AgentTimeout = cmp.Or(c.AgentTimeout, AgentTimeoutDefault)
	c.WorkspaceDir = cmp.Or(c.WorkspaceDir, filepath.Join(c.DataDir, "workspace"))
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.AckWait = cmp.Or(c.AckWait, AckWaitDefault)
	c.KillGrace = cmp.Or(c.KillGrace, KillGraceDefault)
	if c.LogLocal == nil {
		c.LogLocal = new(true)
	}
	c.LogBuffer = cmp.Or(c.LogBuffer, LogBufferDefault)
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
}

// Validate reports a configuration the runner cannot run with.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxConcurrency < 1 {
		errs = append(errs, errors.New("ORCH_MAX_CONCURRENCY must be at least 1"))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, errors.New("ORCH_MAX_ATTEMPTS must be at least 1"))
	}
	if c.AckWait < time.Second {
		errs = append(errs, errors.New("ORCH_ACK_WAIT must be at least 1s"))
	}
	if _, err := agent.SplitArgs(c.AgentCommand); err != nil {
		errs = append(errs, fmt.Errorf("ORCH_AGENT_COMMAND: %w", err))
	}
	return errors.Join(errs...)
}

// Runner runs jobs.
type Runner struct {
	cfg Config
	log *zap.Logger
	// projects is the registry and its templates, swapped whole on SIGHUP.
	projects atomic.Pointer[projects]
	nc       *nats.Conn
	js       jetstream.JetStream
	jobsKV   jetstream.KeyValue
	locks    jetstream.KeyValue
	status   *status.Store
	ws       *workspace.Workspace
	argv     []string
	envAllow []string
	metrics  *metrics
}

// Run pulls and runs jobs until ctx is cancelled, then stops taking jobs,
// lets running agents finish within ShutdownGrace, and hands back the jobs
// of those it had to stop.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.KillGrace >= cfg.AckWait/3 {
		log.Warn("ORCH_AGENT_KILL_GRACE is not below ORCH_ACK_WAIT/3: an agent stopped for a lost lease may still run when its job is handed to another runner",
			zap.Duration("kill_grace", cfg.KillGrace), zap.Duration("ack_wait", cfg.AckWait))
	}
	projs, err := loadProjects(cfg.ProjectsFile)
	if err != nil {
		return err
	}
	// The agent runs in its worktree: every path it is given is absolute.
	if cfg.WorkspaceDir, err = filepath.Abs(cfg.WorkspaceDir); err != nil {
		return fmt.Errorf("ORCH_WORKSPACE_DIR: %w", err)
	}
	ws := &workspace.Workspace{Root: cfg.WorkspaceDir}
	removed, err := ws.Clean(ctx)
	for _, l := range removed {
		log.Warn("removed stale git lock", zap.String("path", l))
	}
	if err != nil {
		return fmt.Errorf("cleaning workspace: %w", err)
	}

	m := newMetrics()
	httpSrv, err := service.ServeHTTP(cfg.HTTPAddr, cfg.Listener, m.reg, m.ready, log.Named("http"))
	if err != nil {
		return err
	}
	defer httpSrv.Stop()

	nc, js, kv, err := service.Connect(ctx, cfg.Common, "runner", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	m.nc.Store(nc)
	locks, err := js.KeyValue(ctx, proto.BucketTaskLocks)
	if err != nil {
		return fmt.Errorf("opening bucket %s: %w", proto.BucketTaskLocks, err)
	}
	argv, _ := agent.SplitArgs(cfg.AgentCommand)
	r := &Runner{
		cfg: cfg, log: log, nc: nc, js: js, jobsKV: kv, locks: locks, status: status.New(kv),
		ws: ws, argv: argv, metrics: m,
		envAllow: append(append([]string(nil), agent.EnvAllowDefault...), cfg.AgentEnv...),
	}
	r.projects.Store(projs)
	r.checkClaude(log, projs.reg)
	m.known = func(key string) bool { _, ok := r.projects.Load().reg.ByKey(key); return ok }
	for _, p := range projs.reg.Projects() {
		m.project(p.Key)
	}

	// SIGHUP reloads the registry for as long as Run runs: the goroutine
	// ends, and the signal goes back to its default, when Run returns.
	var bg sync.WaitGroup
	defer bg.Wait()
	hupCtx, stopHup := context.WithCancel(ctx)
	defer stopHup()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	bg.Go(func() { r.reloadOnSignal(hupCtx, hup) })

	cons, err := js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(cfg.MaxConcurrency, cfg.MaxAttempts, cfg.AckWait))
	if err != nil {
		return fmt.Errorf("ensuring consumer %s: %w", proto.ConsumerRunner, err)
	}
	return r.consume(ctx, cons)
}

// projects is one version of the project registry and the task templates
// it names. They are loaded and swapped together, and a job takes one
// version when it starts and keeps it to its end, so a reload never gives
// a job in flight a project and templates from different files.
type projects struct {
	reg   *registry.Registry
	tmpls *prompt.Templates
}

// loadProjects reads the registry at path and the templates it names.
// Its errors name the file and, for the registry, the line.
func loadProjects(path string) (*projects, error) {
	reg, err := registry.Load(path)
	if err != nil {
		return nil, err
	}
	tmpls, err := prompt.Load(reg)
	if err != nil {
		return nil, err
	}
	return &projects{reg: reg, tmpls: tmpls}, nil
}

// reloadOnSignal reloads the registry and its templates on every signal on
// hup until ctx ends. A file or template that does not load leaves the old
// version in place, so a typo never stops a running runner.
func (r *Runner) reloadOnSignal(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		p, err := loadProjects(r.cfg.ProjectsFile)
		if err != nil {
			r.log.Error("reloading the project registry failed, keeping the old one", zap.String("file", r.cfg.ProjectsFile), zap.Error(err))
			continue
		}
		r.projects.Store(p)
		r.log.Info("project registry reloaded", zap.String("file", r.cfg.ProjectsFile), zap.Int("projects", len(p.reg.Projects())))
	}
}

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
			defer func() { <-slots }()
			r.handle(agentCtx, msg)
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

	if st, _, err := r.status.Get(ctx, job.ID); err == nil {
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
	out := r.run(jobCtx, log, job, p, projs.tmpls, attempt)
	out.began = began
	if jobCtx.Err() != nil && out.res.Err == nil {
		// The agent finished as the job was being stopped: its success
		// stands, unless the job is no longer this runner's.
		if c := context.Cause(jobCtx); errors.Is(c, errLeaseLost) || errors.Is(c, errLockLost) {
			out.res.Err = c
		}
	}
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

// run records the job as running, prepares the worktree and runs the
// agent (or, for a cleanup, removes the worktree). p and tmpls are of the
// registry version the job started with.
func (r *Runner) run(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, tmpls *prompt.Templates, attempt int) outcome {
	logPath := r.ws.LogPath(job.ID, attempt)
	if job.Kind == proto.KindCleanup {
		logPath = ""
	}
	logField := ""
	if *r.cfg.LogLocal {
		logField = logPath
	}
	st, err := r.status.Apply(ctx, job, status.StartAttempt(attempt, r.cfg.MaxAttempts, r.cfg.Name, logField, time.Now().UTC()))
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
		if err := r.ws.Remove(ctx, job.Project, job.Task.ID); err != nil {
			return outcome{res: agent.Result{ExitCode: -1, Err: err}}
		}
		return outcome{}
	}

	fail := func(err error) outcome { return outcome{res: agent.Result{ExitCode: -1, Err: err}, log: logPath} }
	co, err := r.prepareTimed(ctx, log, job, p)
	if err != nil {
		return fail(fmt.Errorf("preparing worktree: %w", err))
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

// watchCancel watches the job's record and stops the job with
// errCancelled when it turns cancelled. The watch starts with the current
// value, so a cancel that came just before is seen too.
func (r *Runner) watchCancel(ctx context.Context, log *zap.Logger, jobID string, stop context.CancelCauseFunc) {
	for ctx.Err() == nil {
		w, err := r.jobsKV.Watch(ctx, jobID)
		if err != nil {
			log.Debug("watching status for cancel", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		cancelled := func() bool {
			defer func() { _ = w.Stop() }()
			for {
				select {
				case <-ctx.Done():
					return false
				case e, ok := <-w.Updates():
					if !ok {
						return false
					}
					if e == nil || e.Operation() != jetstream.KeyValuePut {
						continue
					}
					if st, err := proto.DecodeStatus(e.Value()); err == nil && st.State == proto.StateCancelled {
						return true
					}
				}
			}
		}()
		if cancelled {
			log.Info("job cancelled: stopping it")
			stop(errCancelled)
			return
		}
	}
}

// settle records how the attempt ended and acks, retries, hands back or
// terminates the message. ctx may be the reason the job stopped: the
// outcome is still written, within AckWait.
func (r *Runner) settle(ctx context.Context, log *zap.Logger, msg jetstream.Msg, job *proto.Job, p *registry.Project, attempt int, out outcome) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
	defer cancel()
	res := out.res
	o := status.Outcome{
		Attempt: attempt, MaxAttempts: r.cfg.MaxAttempts, Runner: r.cfg.Name,
		FinishedAt: time.Now().UTC(), ExitCode: res.ExitCode,
	}
	if res.Err != nil {
		o.Err = res.Err.Error()
	}
	if c := out.claude; c != nil {
		o.Agent, o.CostUSD, o.Turns, o.SessionID = true, c.TotalCostUSD, c.NumTurns, c.SessionID
		o.Result = c.Text()
	}
	// record applies t and reports whether it wrote; a refusal (the
	// record has moved on) is not retried.
	record := func(t func(status.Outcome) status.Transition) bool {
		tr := t(o)
		var refused bool
		err := retry(ctx, func() error {
			_, err := r.status.Apply(ctx, job, tr)
			if errors.Is(err, status.ErrTerminal) || errors.Is(err, status.ErrSuperseded) {
				refused = true
				return nil
			}
			return err
		})
		if err != nil {
			log.Warn("recording state", zap.String("transition", tr.Name), zap.Error(err))
			return false
		}
		return !refused
	}
	switch {
	case errors.Is(res.Err, errAlreadyDone):
		// A success redelivered (its ack was lost): finish what the first
		// settle may not have, the pipeline and the ack.
		log.Info("job already done: acking the redelivery")
		r.advance(ctx, log, job, p)
		if err := retry(ctx, func() error { return msg.DoubleAck(ctx) }); err != nil {
			log.Warn("ack", zap.Error(err))
		}
	case errors.Is(res.Err, errCancelled):
		r.recordCancelled(ctx, log, job, attempt, res)
		r.metrics.settled(job, out, outcomeCancelled)
		if err := msg.TermWithReason(proto.ReasonCancelled); err != nil {
			log.Warn("terminating cancelled job", zap.Error(err))
		}
		log.Info("job cancelled")
	case errors.Is(res.Err, errLeaseLost), errors.Is(res.Err, errLockLost), errors.Is(res.Err, errSuperseded):
		// JetStream has given or will give the job to another runner:
		// leave the message and the record to it.
		log.Warn("job lost to another runner: not settling it", zap.Error(res.Err))
		r.metrics.settled(job, out, outcomeLostLease)
	case errors.Is(res.Err, errShutdown):
		record(status.Requeue)
		r.metrics.settled(job, out, outcomeHandedBack)
		// Handed back at once: the attempt was not the job's fault.
		_ = msg.Nak()
		log.Warn("job stopped by shutdown: handed back", zap.Error(res.Err))
	case errors.Is(res.Err, agent.ErrPermissionDenied):
		// Denied tools, or Claude Code refusing to bypass permissions as
		// root: a retry would fail the same way, so fail the job now. Term
		// reaches the notifier as MSG_TERMINATED with a runner's reason,
		// which it alerts on and dead-letters like any failure.
		if !record(status.Fail) {
			log.Warn("agent lacks the permissions it needs, but the record has moved on: not terminating", zap.Error(res.Err))
			return
		}
		if err := retry(ctx, func() error { return msg.TermWithReason(proto.TermReason(job.ID, res.Err.Error())) }); err != nil {
			log.Warn("terminating job", zap.Error(err))
		}
		log.Error("agent lacks the permissions it needs: job failed without retries", zap.Error(res.Err))
	case res.Err == nil:
		if !record(status.Finish) {
			if st, _, err := r.status.Get(ctx, job.ID); err == nil && st.Attempt > attempt {
				log.Warn("job done, but a later delivery owns it now: not acking")
				r.metrics.settled(job, out, outcomeLostLease)
				return
			}
		}
		r.advance(ctx, log, job, p)
		if err := retry(ctx, func() error { return msg.DoubleAck(ctx) }); err != nil {
			log.Warn("ack", zap.Error(err))
		}
		log.Info("job done", zap.Duration("took", res.Duration), zap.Float64("cost_usd", costOf(out.claude)))
		r.metrics.settled(job, out, outcomeDone)
	case attempt < r.cfg.MaxAttempts:
		delay := RetryDelay(r.cfg.RetryDelay, r.cfg.RetryMaxDelay, attempt)
		record(status.Retry)
		r.metrics.settled(job, out, outcomeRetry)
		if err := msg.NakWithDelay(delay); err != nil {
			log.Warn("nak", zap.Error(err))
		}
		log.Warn("agent failed: will retry", zap.Error(res.Err), zap.Int("exit_code", res.ExitCode), zap.Duration("delay", delay))
	default:
		// The last attempt: JetStream's MAX_DELIVERIES advisory takes it
		// to the notifier, which alerts and dead-letters it.
		record(status.Fail)
		r.metrics.settled(job, out, outcomeFailed)
		_ = msg.Nak()
		log.Error("agent failed on its last attempt", zap.Error(res.Err), zap.Int("exit_code", res.ExitCode))
	}
}

func costOf(c *agent.ClaudeResult) float64 {
	if c == nil {
		return 0
	}
	return c.TotalCostUSD
}

// recordCancelled adds how the stopped attempt ended to a cancelled
// record; the state stays cancelled.
func (r *Runner) recordCancelled(ctx context.Context, log *zap.Logger, job *proto.Job, attempt int, res agent.Result) {
	_, err := r.status.Apply(ctx, job, status.Stopped(attempt, r.cfg.Name, res.ExitCode, time.Now().UTC()))
	if err != nil && !errors.Is(err, status.ErrNotCancelled) && !errors.Is(err, status.ErrSuperseded) {
		log.Warn("recording cancelled job", zap.Error(err))
	}
}

// advance queues the next kind of the project's pipeline for the same
// task. The next job's id is derived from this job's id, so a redelivered
// success names the same job: JetStream's duplicate window drops a second
// publish, and past it the existing status record does.
func (r *Runner) advance(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project) {
	next := proto.Kind(p.Pipeline[string(job.Kind)])
	if next == "" {
		return
	}
	nj := proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID("pipeline|" + job.ID + "|" + string(next)),
		Kind: next, Project: job.Project, Task: job.Task, CreatedAt: time.Now().UTC(),
		Source: proto.Source{System: "runner", Event: "pipeline", Delivery: job.ID, Actor: r.cfg.Name},
	}
	log = log.With(zap.String("next_job", nj.ID), zap.String("next_kind", string(next)))
	err := retry(ctx, func() error {
		if _, _, err := r.status.Get(ctx, nj.ID); err == nil {
			return nil // queued before
		} else if !errors.Is(err, status.ErrNotFound) {
			return err
		}
		data, err := json.Marshal(nj)
		if err != nil {
			return err
		}
		if _, err := r.js.Publish(ctx, proto.JobSubject(nj.Project, nj.Kind), data, jetstream.WithMsgID(nj.ID)); err != nil {
			return fmt.Errorf("publishing job %s: %w", nj.ID, err)
		}
		// A runner may already have picked it up: Queue leaves its state.
		if _, err := r.status.Apply(ctx, &nj, status.Queue(r.cfg.MaxAttempts)); err != nil && !errors.Is(err, status.ErrExists) {
			return err
		}
		return nil
	})
	if err != nil {
		log.Error("pipeline: queuing the next job failed", zap.Error(err))
		return
	}
	log.Info("pipeline: next job queued")
}

// retry calls f until it succeeds or ctx ends, backing off from 50ms to 1s.
// It rides out a short NATS outage during a settle.
func retry(ctx context.Context, f func() error) error {
	delay := 50 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// RetryDelay is the delay before attempt+1: base doubled per attempt,
// capped at max, with up to 20% jitter either way so that jobs that failed
// together do not retry together.
func RetryDelay(base, maxDelay time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	jitter := time.Duration((rand.Float64()*0.4 - 0.2) * float64(d))
	return min(d+jitter, maxDelay)
}
