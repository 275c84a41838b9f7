package runner

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// Config is the runner's configuration, read from ORCH_ variables; the
// envDefault tags are the defaults.
type Config struct {
	service.Common
	// ProjectsFile is the project registry; SIGHUP reloads it and the
	// task templates it names.
	ProjectsFile string `env:"PROJECTS_FILE" envDefault:"projects.yaml"`
	// MaxConcurrency is how many agents run at once across all runners.
	MaxConcurrency int `env:"MAX_CONCURRENCY" envDefault:"1"`
	// MaxAttempts is how many deliveries a job gets.
	MaxAttempts int `env:"MAX_ATTEMPTS" envDefault:"3"`
	// RetryDelay is the first retry's delay; it doubles per attempt,
	// jittered, up to RetryMaxDelay. 0 retries at once.
	RetryDelay    time.Duration `env:"RETRY_DELAY" envDefault:"30s"`
	RetryMaxDelay time.Duration `env:"RETRY_MAX_DELAY" envDefault:"15m"`
	// AgentCommand is the agent's argv, split as a shell would but never
	// run by one: Claude Code in print mode.
	AgentCommand string `env:"AGENT_COMMAND" envDefault:"claude -p --output-format stream-json --verbose"`
	// AgentTimeout is the watchdog; 0 is none. A project's agent_timeout
	// overrides it.
	AgentTimeout time.Duration `env:"AGENT_TIMEOUT" envDefault:"60m"`
	// AgentEnv names more variables of the runner's environment to pass
	// to the agent, besides agent.EnvAllowDefault.
	AgentEnv []string `env:"AGENT_ENV"`
	// WorkspaceDir holds worktrees and logs; empty means
	// $ORCH_DATA_DIR/workspace.
	WorkspaceDir string `env:"WORKSPACE_DIR"`
	// ShutdownGrace is how long running agents may finish after SIGTERM;
	// 0 stops them at once.
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE" envDefault:"30s"`
	// AckWait is how long a job may go without a heartbeat before
	// JetStream hands it to another runner.
	AckWait time.Duration `env:"ACK_WAIT" envDefault:"30s"`
	// Name identifies this runner in status records; empty means the host
	// name.
	Name string `env:"RUNNER_NAME"`
	// KillGrace is how long an agent's process group has between SIGTERM
	// and SIGKILL when it is stopped (watchdog, cancel, shutdown, lost
	// lease); 0 sends SIGKILL right after SIGTERM. The task lock's
	// staleness (lock.go) counts the same value.
	KillGrace time.Duration `env:"AGENT_KILL_GRACE" envDefault:"5s"`
	// HTTPAddr is where /healthz, /readyz and /metrics are served. A
	// Config built in Go with it empty serves nothing, so that several
	// runners can share a process.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8081" default:"env-only"`
	// Listener, when set, is served instead of HTTPAddr (tests).
	Listener net.Listener `env:"-"`
	// LogLocal keeps each attempt's output in a file under WorkspaceDir
	// after the attempt; off, the file only buffers the output while the
	// agent runs. JOBS_LOGS has the output either way.
	LogLocal *bool `env:"LOG_LOCAL" envDefault:"true"`
	// LogBuffer bounds the agent output a runner holds while JetStream
	// does not take it; what does not fit is dropped, and the log says
	// so. It must be above 0.
	LogBuffer service.ByteSize `env:"LOG_BUFFER" envDefault:"8MiB"`
	// BudgetTZ is the time zone of the budgets' calendar days and months
	// (an IANA name such as Europe/Berlin).
	BudgetTZ string `env:"BUDGET_TZ" envDefault:"UTC"`
	// ModelPricesFile is a JSON price table (prices.go) laid over the
	// built-in one that spend is metered by: a model orch does not know
	// yet, or a price that changed. Empty: the built-in table.
	ModelPricesFile string `env:"MODEL_PRICES_FILE"`

	// AgentSandbox confines every agent (package sandbox): auto uses
	// bubblewrap when it works on this host, found by trying it at start,
	// and runs unconfined, saying so, when it does not; bwrap requires
	// it (the runner does not start without); none runs unconfined.
	AgentSandbox sandbox.Mode `env:"AGENT_SANDBOX" envDefault:"auto"`
	// AgentNetwork is what a confined agent may reach: allowlist, only
	// the job's egress proxy (AgentEgress, the project's egress, its git
	// host and the model API); open, the host's network; none, nothing.
	AgentNetwork sandbox.Network `env:"AGENT_NETWORK" envDefault:"allowlist"`
	// AgentEgress are the host[:port] entries (port 443 when left out)
	// every project's agents may reach under the allowlist.
	AgentEgress []string `env:"AGENT_EGRESS"`
	// AgentSandboxRO and AgentSandboxRW are more paths of the host a
	// confined agent sees, read-only or writable (a toolchain, a build
	// cache), colon-separated.
	AgentSandboxRO []string `env:"AGENT_SANDBOX_RO" envSeparator:":"`
	AgentSandboxRW []string `env:"AGENT_SANDBOX_RW" envSeparator:":"`
	// AgentSandboxInit is the init program of every agent's sandbox
	// (sandbox.FindInit). Empty: orch-sandbox-init beside the runner's
	// executable, else the runner's executable itself.
	AgentSandboxInit string `env:"AGENT_SANDBOX_INIT"`
	// AgentMemoryMax bounds each agent process's memory (RLIMIT_DATA);
	// empty or 0 is no limit.
	AgentMemoryMax service.ByteSize `env:"AGENT_MEMORY_MAX"`
	// AgentPidsMax bounds the agent user's processes (RLIMIT_NPROC; not
	// applied to root); 0 is no limit.
	AgentPidsMax int `env:"AGENT_PIDS_MAX"`
	// GitCredentialsFile is a git-credential-store file whose entry for
	// a project's git host the egress proxy adds to a confined agent's
	// git requests, so that it can push without holding the token; the
	// runner's own fetches of the clone read it too
	// (workspace.Workspace.GitCredentials).
	GitCredentialsFile string `env:"GIT_CREDENTIALS_FILE"`

	// TaskStateInterval is how often the state of a task whose agent runs
	// is saved into the object store task_state (package taskstate),
	// besides when each attempt ends: a runner killed meanwhile loses at
	// most this much of the task's work. 0 saves only at the end.
	TaskStateInterval time.Duration `env:"TASK_STATE_INTERVAL" envDefault:"60s"`
	// TaskStateMaxBytes bounds a saved task state: past it only the
	// commits and the agent's session are saved, not the uncommitted
	// changes and untracked files, and the next task file says so. 0 is
	// no bound.
	TaskStateMaxBytes service.ByteSize `env:"TASK_STATE_MAX_BYTES" envDefault:"256MiB"`
}

// SetDefaults gives a Config built in Go its defaults (see
// service.SetDefaults), and the settings whose default is derived.
func (c *Config) SetDefaults() {
	service.SetDefaults(c)
	c.WorkspaceDir = cmp.Or(c.WorkspaceDir, filepath.Join(c.DataDir, "workspace"))
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
	if c.KillGrace < 0 {
		errs = append(errs, errors.New("ORCH_AGENT_KILL_GRACE must not be negative"))
	}
	if c.LogBuffer < 1 {
		errs = append(errs, errors.New("ORCH_LOG_BUFFER must be above 0: it bounds the agent output a runner holds while JetStream does not take it"))
	}
	if !c.AgentSandbox.Valid() {
		errs = append(errs, fmt.Errorf("ORCH_AGENT_SANDBOX %q: want auto, bwrap or none", c.AgentSandbox))
	}
	if !c.AgentNetwork.Valid() {
		errs = append(errs, fmt.Errorf("ORCH_AGENT_NETWORK %q: want allowlist, open or none", c.AgentNetwork))
	}
	if c.TaskStateInterval < 0 || c.TaskStateMaxBytes < 0 {
		errs = append(errs, errors.New("ORCH_TASK_STATE_INTERVAL and ORCH_TASK_STATE_MAX_BYTES must not be negative"))
	}
	if c.AgentMemoryMax < 0 || c.AgentPidsMax < 0 {
		errs = append(errs, errors.New("ORCH_AGENT_MEMORY_MAX and ORCH_AGENT_PIDS_MAX must not be negative"))
	}
	for _, p := range append(append([]string(nil), c.AgentSandboxRO...), c.AgentSandboxRW...) {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("ORCH_AGENT_SANDBOX_RO/RW: %q is not an absolute path", p))
		} else if _, err := os.Stat(p); err != nil {
			errs = append(errs, fmt.Errorf("ORCH_AGENT_SANDBOX_RO/RW: %w", err))
		}
	}
	if c.AgentSandboxInit != "" && !filepath.IsAbs(c.AgentSandboxInit) {
		errs = append(errs, fmt.Errorf("ORCH_AGENT_SANDBOX_INIT: %q is not an absolute path", c.AgentSandboxInit))
	}
	if _, err := agent.SplitArgs(c.AgentCommand); err != nil {
		errs = append(errs, fmt.Errorf("ORCH_AGENT_COMMAND: %w", err))
	}
	return errors.Join(errs...)
}
