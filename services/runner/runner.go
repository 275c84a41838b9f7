// Package runner pulls jobs from JetStream and runs an agent for each, no
// more at once than the runner consumer's MaxAckPending allows across every
// runner, retrying failures with a growing delay until MaxDeliver.
package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/registry"
	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/proto/status"
	"github.com/orch-dev/orch/services/runner/agent"
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
)

// Config is the runner's configuration, read from ORCH_ variables.
type Config struct {
	service.Common
	// ProjectsFile is the project registry. Default "projects.yaml".
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
	cfg      Config
	log      *zap.Logger
	reg      *registry.Registry
	status   *status.Store
	ws       *workspace.Workspace
	argv     []string
	envAllow []string
}

// Run pulls and runs jobs until ctx is cancelled, then stops taking jobs,
// lets running agents finish within ShutdownGrace, and hands back the jobs
// of those it had to stop.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	reg, err := registry.Load(cfg.ProjectsFile)
	if err != nil {
		return err
	}
	nc, js, kv, err := service.Connect(ctx, cfg.Common, "runner", log)
	if err != nil {
		return err
	}
	defer nc.Close()

	// The agent runs in its worktree: every path it is given is absolute.
	if cfg.WorkspaceDir, err = filepath.Abs(cfg.WorkspaceDir); err != nil {
		return fmt.Errorf("ORCH_WORKSPACE_DIR: %w", err)
	}
	argv, _ := agent.SplitArgs(cfg.AgentCommand)
	r := &Runner{
		cfg: cfg, log: log, reg: reg, status: status.New(kv),
		ws: &workspace.Workspace{Root: cfg.WorkspaceDir}, argv: argv,
		envAllow: append(append([]string(nil), agent.EnvAllowDefault...), cfg.AgentEnv...),
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(cfg.MaxConcurrency, cfg.MaxAttempts, cfg.AckWait))
	if err != nil {
		return fmt.Errorf("ensuring consumer %s: %w", proto.ConsumerRunner, err)
	}
	return r.consume(ctx, cons)
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
	// then hands the message to a worker.
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
	r.log.Info("runner started", zap.String("runner", r.cfg.Name), zap.Int("max_concurrency", r.cfg.MaxConcurrency),
		zap.Int("max_attempts", r.cfg.MaxAttempts), zap.Strings("agent", r.argv))

	<-ctx.Done()
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

// errShutdown is the cause of agents stopped by a runner shutdown.
var errShutdown = errors.New("runner shutting down")

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
	if err == nil {
		if _, ok := r.reg.ByKey(job.Project); !ok {
			err = fmt.Errorf("unknown project %q", job.Project)
		}
	}
	if err != nil {
		r.terminate(ctx, log, msg, job, attempt, err)
		return
	}
	log = log.With(zap.String("kind", string(job.Kind)), zap.String("project", job.Project), zap.String("task", job.Task.ID))

	if st, _, err := r.status.Get(ctx, job.ID); err == nil && st.State == proto.StateCancelled {
		log.Info("job was cancelled before it ran: skipping")
		_ = msg.TermWithReason(proto.ReasonCancelled)
		return
	}

	res := r.runAgent(ctx, log, msg, job, attempt)
	r.settle(ctx, log, msg, job, attempt, res)
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
	_, err := r.status.Update(ctx, job, func(st *proto.Status) bool {
		now := time.Now().UTC()
		st.State, st.Attempt, st.MaxAttempts = proto.StateFailed, attempt, r.cfg.MaxAttempts
		st.Error, st.Runner, st.FinishedAt = cause.Error(), r.cfg.Name, now
		return true
	})
	if err != nil {
		log.Error("recording terminated job", zap.Error(err))
	}
	if err := msg.TermWithReason(proto.TermReason(job.ID, cause.Error())); err != nil {
		log.Error("terminating message", zap.Error(err))
	}
}

// runAgent records the job as running, runs the agent while telling
// JetStream the job is in progress, and returns how it ended.
func (r *Runner) runAgent(ctx context.Context, log *zap.Logger, msg jetstream.Msg, job *proto.Job, attempt int) (res agent.Result) {
	logPath := r.ws.LogPath(job.ID, attempt)
	if _, err := r.status.Update(ctx, job, func(st *proto.Status) bool {
		st.State, st.Attempt, st.MaxAttempts = proto.StateRunning, attempt, r.cfg.MaxAttempts
		st.Runner, st.StartedAt, st.FinishedAt = r.cfg.Name, time.Now().UTC(), time.Time{}
		st.Log, st.Error, st.ExitCode = logPath, "", nil
		return true
	}); err != nil {
		log.Warn("recording running state", zap.Error(err))
	}

	hbCtx, stopHB := context.WithCancel(ctx)
	var hb sync.WaitGroup
	hb.Go(func() { r.heartbeat(hbCtx, log, msg) })
	defer func() { stopHB(); hb.Wait() }()

	p, _ := r.reg.ByKey(job.Project)
	dir, err := r.ws.TaskDir(job.Project, job.Task.ID)
	if err != nil {
		return agent.Result{ExitCode: -1, Err: err}
	}
	text, err := prompt.Render(job, attempt, r.cfg.MaxAttempts)
	if err != nil {
		return agent.Result{ExitCode: -1, Err: err}
	}
	taskFile, err := r.ws.TaskFile(dir, job.ID, text)
	if err != nil {
		return agent.Result{ExitCode: -1, Err: err}
	}
	argv := r.argv
	if len(p.AgentCommand) > 0 {
		argv = p.AgentCommand
	}
	spec := agent.Spec{
		Argv: argv, Dir: dir, Stdin: text, LogPath: logPath,
		Timeout: cmp.Or(p.AgentTimeout, r.cfg.AgentTimeout),
		Env: agent.Env(r.envAllow,
			"ORCH_JOB_ID="+job.ID, "ORCH_ATTEMPT="+strconv.Itoa(attempt), "ORCH_KIND="+string(job.Kind),
			"ORCH_PROJECT="+job.Project, "ORCH_TASK="+job.Task.ID, "ORCH_TASK_FILE="+taskFile),
	}
	log.Info("agent starting", zap.String("dir", dir), zap.String("log", logPath))
	return agent.Run(ctx, spec)
}

// heartbeat tells JetStream the job is in progress, well inside AckWait.
func (r *Runner) heartbeat(ctx context.Context, log *zap.Logger, msg jetstream.Msg) {
	t := time.NewTicker(r.cfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := msg.InProgress(); err != nil {
				log.Warn("heartbeat", zap.Error(err))
			}
		}
	}
}

// settle acks, retries or gives up on a job after its agent ended.
func (r *Runner) settle(ctx context.Context, log *zap.Logger, msg jetstream.Msg, job *proto.Job, attempt int, res agent.Result) {
	// ctx may be the reason the agent stopped; the outcome is still
	// written and the message still settled.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	now := time.Now().UTC()
	record := func(state proto.State) {
		if _, err := r.status.Update(ctx, job, func(st *proto.Status) bool {
			st.State, st.Attempt, st.MaxAttempts = state, attempt, r.cfg.MaxAttempts
			st.FinishedAt, st.Runner = now, r.cfg.Name
			code := res.ExitCode
			st.ExitCode = &code
			st.Error = ""
			if res.Err != nil {
				st.Error = res.Err.Error()
			}
			return true
		}); err != nil {
			log.Warn("recording state", zap.String("state", string(state)), zap.Error(err))
		}
	}
	switch {
	case res.Err == nil:
		record(proto.StateDone)
		if err := msg.DoubleAck(ctx); err != nil {
			log.Warn("ack", zap.Error(err))
		}
		log.Info("job done", zap.Duration("took", res.Duration))
	case errors.Is(res.Err, errShutdown):
		record(proto.StateQueued)
		// Handed back at once: the attempt was not the job's fault.
		_ = msg.Nak()
		log.Warn("agent stopped by shutdown: job handed back", zap.Error(res.Err))
	case attempt < r.cfg.MaxAttempts:
		delay := RetryDelay(r.cfg.RetryDelay, r.cfg.RetryMaxDelay, attempt)
		record(proto.StateRetrying)
		if err := msg.NakWithDelay(delay); err != nil {
			log.Warn("nak", zap.Error(err))
		}
		log.Warn("agent failed: will retry", zap.Error(res.Err), zap.Int("exit_code", res.ExitCode), zap.Duration("delay", delay))
	default:
		// The last attempt: JetStream's MAX_DELIVERIES advisory takes it
		// to the notifier, which alerts and dead-letters it.
		record(proto.StateFailed)
		_ = msg.Nak()
		log.Error("agent failed on its last attempt", zap.Error(res.Err), zap.Int("exit_code", res.ExitCode))
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
