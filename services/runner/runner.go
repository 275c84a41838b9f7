// Package runner pulls jobs from JetStream and runs an agent for each, no
// more at once than the runner consumer's MaxAckPending allows across every
// runner, retrying failures with a growing delay until MaxDeliver.
//
// Each job runs in its task's git worktree (package workspace), holding
// the task's lock (lock.go) so no two jobs of a task share the worktree at
// once, under a heartbeat that is also a lease (lease.go): a runner that
// cannot reach JetStream for most of AckWait stops its agent, because the
// job is about to be handed to another runner. Every status write is one
// of the lifecycle's transitions (package status), a compare-and-set that
// never moves a record back from a terminal state or from a later attempt,
// so a runner that lost its job cannot overwrite what the runner that has
// it now wrote.
//
// The files follow a job: config.go (settings), runner.go (start-up),
// reload.go (the registry on SIGHUP), intake.go (pulling jobs and the
// shutdown), fairness.go (admission: the project's slot, priority, fair
// share), hold.go (a job that may not start now is held) and release.go
// (the releaser that publishes it again), delivery.go (one delivery:
// checks, lock, agent), running.go (the running state, written beside
// the agent's start), checkout.go (the worktree at the job's head),
// carry.go (the task's work and session carried over from an earlier
// attempt, saved for the next), agentcmd.go (the agent's argv and
// environment, Claude Code's permissions), confine.go (the agent's
// sandbox, egress proxy and limits, chosen at start), prestart.go (the
// sandbox made beside admission, its agent held at a gate), output.go
// (running the agent while its output goes to JOBS_LOGS), spendwatch.go
// (a running agent's spend against its cap), meters.go (the egress
// proxy's meter of it, and a 429 that is the account's usage limit),
// prices.go (the price table of ORCH_MODEL_PRICES_FILE), secrets.go (the
// agent's words scrubbed before the record keeps them), lease.go and
// lock.go, cancel.go (the
// cancel watch), decide.go (what an outcome means: the verdict, pure and
// table-tested), settle.go (applying the verdict: the record, ack or
// nak), pipeline.go (the next kind), backoff.go (the waits between tries)
// and metrics.go. deployments/check's TestRunnerFileList holds this list
// to the package's files.
package runner

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/egress"
	"github.com/orch-dev/orch/services/runner/sandbox"
	"github.com/orch-dev/orch/services/runner/taskstate"
	"github.com/orch-dev/orch/services/runner/workspace"
)

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
	// conf is how agents run: confined or not, their network and limits.
	conf confinement
	// state carries tasks' work between runners (carry.go); nil when the
	// object store task_state cannot be opened.
	state        *taskstate.Store
	stateMetrics *stateMetrics
	// pauses and spendKV are the buckets of holds (hold.go): pauses of
	// projects and credentials, each project's spend per budget window,
	// whose calendar is loc (ORCH_BUDGET_TZ). credID names the model
	// credential the agents use.
	pauses, spendKV jetstream.KeyValue
	loc             *time.Location
	credID          string
	// pokeRelease makes the releaser (release.go) look at held jobs at
	// once: a registry reload may have raised a budget.
	pokeRelease chan struct{}
	// meters holds, by job id, the egress proxy of each confined agent
	// while it runs (meters.go); prices is the table spend is metered by
	// (prices.go).
	meters sync.Map
	prices map[string]egress.Price
	// jobsStream is JOBS, whose count per subject says what waits; locks
	// holds the projects' slots besides the task locks (fairness.go).
	jobsStream jetstream.Stream
	fair       fairness
	// agents keeps agent supervisors started ahead of the jobs.
	agents *agent.Pool
	// sessions holds, by task (lockKey), the agent session the task's
	// last job here ended with: what its next job likely resumes, which
	// the sandbox made ahead runs (prestart.go).
	sessions sync.Map
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
	if cfg.GitCredentialsFile != "" {
		// The clone's fetches use it too; git runs them in the clone.
		if ws.GitCredentials, err = filepath.Abs(cfg.GitCredentialsFile); err != nil {
			return fmt.Errorf("ORCH_GIT_CREDENTIALS_FILE: %w", err)
		}
	}
	removed, err := ws.Clean(ctx)
	for _, l := range removed {
		log.Warn("removed stale git lock", zap.String("path", l))
	}
	if err != nil {
		// A stop while starting kills Clean's git: a clean stop, not
		// a failure (make soak's chaos stops runners that just began).
		return fmt.Errorf("cleaning workspace: %w", errors.Join(ctx.Err(), err))
	}

	m := newMetrics()
	conf, err := chooseConfinement(ctx, cfg, log)
	if err != nil {
		return err
	}
	m.sandbox.WithLabelValues(conf.sandboxName()).Set(1)
	if conf.bwrap != "" {
		// The sandboxes bind a copy of the host's /etc in one mount.
		etc, err := sandbox.NewEtc("/etc", filepath.Join(ws.Root, "sandbox-etc"))
		if err != nil {
			log.Warn("no copy of /etc for the sandboxes: each binds the host's files one by one", zap.Error(err))
		} else {
			conf.etc = etc
			defer etc.Close()
		}
	}
	httpSrv, err := service.ServeHTTPDetail(cfg.HTTPAddr, cfg.Listener, m.reg, m.ready, conf.detail, log.Named("http"))
	if err != nil {
		return err
	}
	defer httpSrv.Stop()

	nc, js, kv, err := service.Connect(ctx, cfg.Common, "runner", nil, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	m.nc.Store(nc)
	var locks, pauses, spend jetstream.KeyValue
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{proto.BucketTaskLocks, &locks}, {proto.BucketPauses, &pauses}, {proto.BucketSpend, &spend}} {
		if err := service.Retry(ctx, log, "opening bucket "+b.name, func(ctx context.Context) (err error) {
			*b.kv, err = js.KeyValue(ctx, b.name)
			return err
		}); err != nil {
			return err
		}
	}
	loc, err := time.LoadLocation(cfg.BudgetTZ)
	if err != nil {
		return fmt.Errorf("ORCH_BUDGET_TZ: %w", err)
	}
	prices, err := loadPrices(cfg.ModelPricesFile)
	if err != nil {
		return err
	}
	argv, _ := agent.SplitArgs(cfg.AgentCommand)
	r := &Runner{
		cfg: cfg, log: log, nc: nc, js: js, jobsKV: kv, locks: locks, status: status.New(kv),
		ws: ws, argv: argv, metrics: m, conf: conf,
		pauses: pauses, spendKV: spend, loc: loc, credID: credentialID(), pokeRelease: make(chan struct{}, 1), prices: prices,
		envAllow: append(append([]string(nil), agent.EnvAllowDefault...), cfg.AgentEnv...),
		fair:     fairness{turns: turns{served: map[string]uint64{}}, here: map[string]int{}},
	}
	r.projects.Store(projs)
	r.stateMetrics = newStateMetrics(m.reg)
	if err := service.Retry(ctx, log, "opening object store "+proto.ObjectStoreTaskState, func(ctx context.Context) error {
		obj, err := js.ObjectStore(ctx, proto.ObjectStoreTaskState)
		if err == nil {
			r.state = &taskstate.Store{Obj: obj, Runner: cfg.Name, MaxBytes: int64(cfg.TaskStateMaxBytes), TempDir: ws.Root}
			if err := r.state.Clean(); err != nil {
				log.Warn("task state: removing what a crash left in the workspace", zap.Error(err))
			}
		}
		return err
	}); err != nil {
		return err
	}
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
	hup, stopHUPSignal := service.NotifyHUP()
	defer stopHUPSignal()
	bg.Go(func() { service.OnSignal(hupCtx, hup, r.reload) })
	bg.Go(func() { r.releaser(hupCtx, r.pokeRelease) })
	bg.Go(func() { r.refreshEtc(hupCtx) })

	var cons jetstream.Consumer
	if err := service.Retry(ctx, log, "ensuring consumer "+proto.ConsumerRunner, func(ctx context.Context) (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(cfg.MaxConcurrency, cfg.MaxAttempts, cfg.AckWait))
		return err
	}); err != nil {
		return err
	}
	if err := service.Retry(ctx, log, "opening stream "+proto.StreamJobs, func(ctx context.Context) (err error) {
		r.jobsStream, err = js.Stream(ctx, proto.StreamJobs)
		return err
	}); err != nil {
		return err
	}
	// Supervisors started ahead take a Go program's start off every
	// job's dispatch, and those whose agent ended run the next
	// (agent/warm.go): two are started ahead, as many as two jobs
	// arriving at once use (a third starts its own), and up to
	// MaxConcurrency wait, each an idle process of a few MiB. Under the
	// allowlist each is started in a network namespace of its own, where
	// it forwards to its agent's egress proxy (agent/forward.go).
	r.agents = agent.NewPool(min(cfg.MaxConcurrency, 2), cfg.MaxConcurrency, r.conf.forwarding())
	defer r.agents.Close()
	return r.consume(ctx, cons)
}
