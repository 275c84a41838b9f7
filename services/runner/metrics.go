package runner

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// Outcomes of an attempt, the values of orch_runner_jobs_finished_total's
// outcome label.
const (
	outcomeDone      = "done"
	outcomeRetry     = "retry"
	outcomeFailed    = "failed"
	outcomeCancelled = "cancelled"
	// outcomeLostLease: the job went to another runner (lease or lock
	// lost, or a later delivery owns the record).
	outcomeLostLease = "lost_lease"
	// outcomeHandedBack: stopped by a shutdown and given back at once.
	outcomeHandedBack = "handed_back"
	// outcomeHeld: held (budget, pause, usage limit), its message acked.
	outcomeHeld = "held"
)

// Buckets of the durations of work that takes minutes: from a second to
// two hours, the agent timeout's range.
var minutesBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200}

// metrics are the runner's Prometheus metrics and the state /readyz
// reports. Every label value is bounded: kind is one of proto's kinds,
// project a key of the registry (else "unknown"), outcome one of the
// outcome constants, code an exit status 0-255 (else "none").
type metrics struct {
	reg      *prometheus.Registry
	finished *prometheus.CounterVec
	jobDur   *prometheus.HistogramVec
	agentDur *prometheus.HistogramVec
	prepDur  prometheus.Histogram
	wait     *prometheus.HistogramVec
	running  prometheus.Gauge
	cost     *prometheus.CounterVec
	turns    *prometheus.CounterVec
	exits    *prometheus.CounterVec
	// egressDenied counts the connections a job's egress proxy refused,
	// by project; sandbox is 1 for the confinement this runner uses
	// (mode bwrap or none), set at start.
	egressDenied *prometheus.CounterVec
	sandbox      *prometheus.GaugeVec
	// ahead counts the sandboxes made ahead of their jobs' admission
	// (prestart.go), by result: used, or ended unused; spares counts the
	// spare worktrees made ready for new tasks, by project.
	ahead  *prometheus.CounterVec
	spares *prometheus.CounterVec
	// spend is what the attempts this runner settled cost, by project
	// (orch_spend_usd_total: summed over runners, the fleet's spend).
	spend *prometheus.CounterVec
	// held, pauses and remaining are the fleet's holds as this runner's
	// releaser sees them (release.go): every runner serves the same
	// figures.
	held      *prometheus.GaugeVec
	pauses    prometheus.Gauge
	remaining *prometheus.GaugeVec
	budget    *prometheus.GaugeVec

	// nc is the NATS connection, once there is one; bound is true while
	// the consumer delivers jobs to this runner.
	nc    atomic.Pointer[nats.Conn]
	bound atomic.Bool
	// known says whether a project key is in the registry now; it is
	// set before the first job.
	known func(string) bool
}

// newMetrics makes the metrics; project readies each project's series.
func newMetrics() *metrics {
	f := service.NewMetrics("runner")
	m := &metrics{
		reg:          f.Registry,
		known:        func(string) bool { return false },
		finished:     f.CounterVec("orch_runner_jobs_finished_total", "Attempts settled, by kind, project and outcome: done, retry, failed (last attempt or cannot run), cancelled, lost_lease (the job went to another runner), handed_back (shutdown).", "kind", "project", "outcome"),
		jobDur:       f.HistogramVec("orch_runner_job_duration_seconds", "One attempt from holding the task's lock to its settle (worktree, agent, status writes), by kind and outcome.", minutesBuckets, "kind", "outcome"),
		agentDur:     f.HistogramVec("orch_runner_agent_duration_seconds", "How long the agent process ran, by kind.", minutesBuckets, "kind"),
		prepDur:      f.Histogram("orch_runner_worktree_prepare_seconds", "Fetching the project's clone and preparing the task's worktree.", []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
		wait:         f.HistogramVec("orch_runner_queue_wait_seconds", "From the job's creation (webhook accepted) to its first attempt starting, by kind.", []float64{.1, .5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600}, "kind"),
		running:      f.Gauge("orch_runner_agents_running", "Agent processes this runner runs now."),
		cost:         f.CounterVec("orch_runner_cost_usd_total", "Cost the agent reported (Claude Code's total_cost_usd), by project and kind.", "project", "kind"),
		turns:        f.CounterVec("orch_runner_agent_turns_total", "Turns the agent reported (Claude Code's num_turns), by project and kind.", "project", "kind"),
		exits:        f.CounterVec("orch_runner_agent_exits_total", "Agent exits by exit status; code \"none\" when it was killed by a signal or did not start.", "code"),
		egressDenied: f.CounterVec("orch_runner_egress_denied_total", "Connections of confined agents that their job's egress proxy refused (not in the allowlist), by project.", "project"),
		spend:        f.CounterVec("orch_spend_usd_total", "Cost of the attempts this runner settled, counted into the project's budget (sum over runners for the fleet's spend), by project.", "project"),
		held:         f.GaugeVec("orch_jobs_held", "Jobs held now, by reason: over_budget, usage_limit, operator (the fleet's figure; every runner serves it).", "reason"),
		pauses:       f.Gauge("orch_pause_active", "Pauses in force now in KV pauses: credentials at their usage limit and projects paused by an operator (the fleet's figure)."),
		remaining:    f.GaugeVec("orch_budget_remaining_usd", "What is left of a project's budget in the current window (day, month); negative when a window ended over it.", "project", "window"),
		budget:       f.GaugeVec("orch_budget_usd", "A project's budget per window (day, month), from the registry: the base of orch_budget_remaining_usd.", "project", "window"),
		sandbox:      f.GaugeVec("orch_runner_sandbox", "1 for how this runner confines its agents: mode bwrap (bubblewrap) or none (unconfined).", "mode"),
		ahead:        f.CounterVec("orch_runner_sandboxes_ahead_total", "Sandboxes made beside a job's admission, its agent held at the gate, by result: used (the agent started in it), ended (unused: the job did not run, or ran another command or in a worktree made again).", "result"),
		spares:       f.CounterVec("orch_runner_spare_worktrees_made_total", "Spare worktrees made ready for a project's next new task (at the default branch's head), by project.", "project"),
	}
	m.ahead.WithLabelValues("used")
	m.ahead.WithLabelValues("ended")
	for _, reason := range proto.HoldReasons {
		m.held.WithLabelValues(reason)
	}
	f.GaugeFunc("orch_runner_consumer_bound", "1 while this runner takes jobs from the runner consumer, else 0.", func() float64 {
		if m.bound.Load() {
			return 1
		}
		return 0
	})
	return m
}

// project readies the series of a registry project, so that its cost
// and turns are served as 0 before its first job: a rate over them, and
// the cost alert, have a start.
func (m *metrics) project(key string) {
	for _, k := range proto.Kinds {
		if !k.RunsAgent() {
			continue
		}
		m.cost.WithLabelValues(key, string(k))
		m.turns.WithLabelValues(key, string(k))
	}
	m.egressDenied.WithLabelValues(key)
	m.spend.WithLabelValues(key)
}

// projectLabel is a project key as a label value: "unknown" for a key
// the registry does not have.
func (m *metrics) projectLabel(key string) string {
	if m.known(key) {
		return key
	}
	return "unknown"
}

// ready is /readyz: NATS connected and the consumer bound.
func (m *metrics) ready() error {
	return service.Ready(m.nc.Load(), m.bound.Load(), proto.ConsumerRunner+": not taking jobs")
}

// labels are a job's kind and project as label values.
func (m *metrics) labels(job *proto.Job) (kind, project string) {
	kind, project = "unknown", "unknown"
	if job == nil {
		return kind, project
	}
	if job.Kind.Valid() {
		kind = string(job.Kind)
	}
	if m.known(job.Project) {
		project = job.Project
	}
	return kind, project
}

// started records the queue wait of a job's first attempt.
func (m *metrics) started(job *proto.Job, attempt int) {
	if attempt == 1 && !job.CreatedAt.IsZero() {
		kind, _ := m.labels(job)
		m.wait.WithLabelValues(kind).Observe(max(0, time.Since(job.CreatedAt).Seconds()))
	}
}

// settled records how an attempt ended.
func (m *metrics) settled(job *proto.Job, out outcome, result string) {
	kind, project := m.labels(job)
	m.finished.WithLabelValues(kind, project, result).Inc()
	if !out.began.IsZero() {
		m.jobDur.WithLabelValues(kind, result).Observe(time.Since(out.began).Seconds())
	}
	if c := out.claude; c != nil {
		m.cost.WithLabelValues(project, kind).Add(max(0, c.TotalCostUSD))
		m.turns.WithLabelValues(project, kind).Add(float64(max(0, c.NumTurns)))
	}
}

// prepareTimed is prepare, timed.
func (r *Runner) prepareTimed(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, attempt int) (workspace.Checkout, error) {
	start := time.Now()
	co, err := r.prepare(ctx, log, job, p, attempt)
	r.metrics.prepDur.Observe(time.Since(start).Seconds())
	return co, err
}

// runAgentTimed runs the agent, counted among the agents running and timed.
func (r *Runner) runAgentTimed(ctx context.Context, job *proto.Job, spec agent.Spec) agent.Result {
	m := r.metrics
	m.running.Inc()
	res := r.agents.Run(ctx, spec)
	m.running.Dec()
	kind, _ := m.labels(job)
	m.agentDur.WithLabelValues(kind).Observe(res.Duration.Seconds())
	code := "none"
	if res.ExitCode >= 0 && res.ExitCode <= 255 {
		code = strconv.Itoa(res.ExitCode)
	}
	m.exits.WithLabelValues(code).Inc()
	return res
}
