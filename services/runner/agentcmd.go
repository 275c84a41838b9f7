package runner

import (
	"cmp"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
)

// agentCommand is the argv of a job's agent and what its environment gets
// besides the job's ORCH_ variables. The command is the project's or the
// runner's. Claude Code also gets the project's permission flags for the
// job's kind (print mode cannot ask for approval: without them every tool
// call that needs one is denied) and, unless the runner's environment sets
// it, a retry count that fits orch's own retries. Any agent gets the
// project's git identity, so that its commits do not fail for the want of
// one.
func (r *Runner) agentCommand(p *registry.Project, kind proto.Kind) (argv, env []string) {
	argv = r.commandOf(p)
	if agent.IsClaude(argv) {
		perm := agent.Permissions(p.AgentPermissions, kind)
		argv = agent.WithPermissions(argv, perm.Mode, perm.AllowedTools, perm.DisallowedTools)
		if _, set := os.LookupEnv(agent.ClaudeMaxRetriesEnv); !set {
			env = append(env, agent.ClaudeMaxRetriesEnv+"="+strconv.Itoa(agent.ClaudeMaxRetriesDefault))
		}
	}
	if a := p.GitAuthor; a != nil {
		env = append(env,
			"GIT_AUTHOR_NAME="+a.Name, "GIT_AUTHOR_EMAIL="+a.Email,
			"GIT_COMMITTER_NAME="+a.Name, "GIT_COMMITTER_EMAIL="+a.Email)
	}
	return argv, env
}

// commandOf is the agent command of p's jobs: the project's own, else
// the runner's ORCH_AGENT_COMMAND.
func (r *Runner) commandOf(p *registry.Project) []string {
	if len(p.AgentCommand) > 0 {
		return p.AgentCommand
	}
	return r.argv
}

// checkClaude warns at start about settings under which Claude Code cannot
// work unattended as configured: run as root, it refuses to bypass
// permissions; and a watchdog shorter than its own API retries stops it
// before it can report the API's error.
func (r *Runner) checkClaude(log *zap.Logger, reg *registry.Registry) {
	retries := agent.ClaudeMaxRetriesDefault
	if v, err := strconv.Atoi(os.Getenv(agent.ClaudeMaxRetriesEnv)); err == nil {
		retries = v
	}
	apiTimeout := agent.ClaudeAPITimeoutDefault
	if v, err := strconv.Atoi(os.Getenv(agent.ClaudeAPITimeoutEnv)); err == nil {
		apiTimeout = time.Duration(v) * time.Millisecond
	}
	span := agent.ClaudeRetrySpan(retries, apiTimeout)
	root := os.Geteuid() == 0
	for _, p := range reg.Projects() {
		if !agent.IsClaude(r.commandOf(p)) {
			continue
		}
		log := log.With(zap.String("project", p.Key))
		// A timeout of 0 is no watchdog: nothing stops Claude Code early.
		if timeout := cmp.Or(p.AgentTimeout, r.cfg.AgentTimeout); timeout > 0 && timeout <= span {
			log.Warn("the agent timeout is not above Claude Code's own API retries: an API outage ends in the watchdog instead of Claude Code's error; lower CLAUDE_CODE_MAX_RETRIES or API_TIMEOUT_MS, or raise the timeout",
				zap.Duration("agent_timeout", timeout), zap.Duration("claude_retry_span", span), zap.Int("claude_max_retries", retries))
		}
		if !root {
			continue
		}
		for _, kind := range []string{"implement", "review", "fix", "respond"} {
			if agent.Permissions(p.AgentPermissions, proto.Kind(kind)).Mode == "bypassPermissions" {
				log.Warn("running as root: Claude Code refuses mode bypassPermissions as root; run the runner as a non-root user",
					zap.String("kind", kind))
			}
		}
	}
}
