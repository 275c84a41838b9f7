package runner

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/logstream"
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
