package agent

import (
	"os"
	"slices"
)

// EnvAllowDefault names the variables of the runner's own environment that
// reach the agent. orch's secrets (webhook secrets, bot token, API token,
// NATS credentials) are never among them.
var EnvAllowDefault = []string{
	"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR", "TERM",
	"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN", ClaudeMaxRetriesEnv, ClaudeAPITimeoutEnv,
	"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
	"SSH_AUTH_SOCK", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
}

// Env builds the agent's environment: the allowed variables of this
// process's environment, then extra ("KEY=value"), which win.
func Env(allow []string, extra ...string) []string {
	var env []string
	for _, name := range allow {
		if v, ok := os.LookupEnv(name); ok && !slices.ContainsFunc(extra, hasKey(name)) {
			env = append(env, name+"="+v)
		}
	}
	return append(env, extra...)
}

func hasKey(name string) func(string) bool {
	return func(kv string) bool { return len(kv) > len(name) && kv[:len(name)+1] == name+"=" }
}
