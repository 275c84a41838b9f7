package runner_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// The real Claude Code CLI gets what is left of the project's budget as
// --max-budget-usd and its max_turns as --max-turns, and stops at them:
// its result's subtype (error_max_budget_usd, error_max_turns) fails the
// job for good with over_budget or max_turns. (A max_cost_usd this small
// is caught by orch's own watch first.) Against a stand-in API,
// outside CI:
//
//	fakeanthropic -addr 127.0.0.1:0 -script commit 2>fake.log
//	ORCH_TEST_CLAUDE_API=http://127.0.0.1:<port> go test -run TestRealClaudeGetsSpendLimits ./services/runner/
func TestRealClaudeGetsSpendLimits(t *testing.T) {
	api := os.Getenv(claudeAPIEnv)
	if api == "" {
		t.Skip(claudeAPIEnv + " is not set: no stand-in API for the real Claude Code CLI")
	}
	if _, err := exec.LookPath("claude"); err != nil {
		t.Skip("no claude on PATH")
	}
	for _, tc := range []struct{ name, extra, want string }{
		{"budget", "    budget: {daily_usd: 0.0001}\n    agent_permissions: {allowed_tools: [Bash]}\n", proto.HoldOverBudget + ": Claude Code stopped at its budget"},
		{"turns", "    max_turns: 1\n    agent_permissions: {allowed_tools: [Bash]}\n", "max_turns: Claude Code stopped at max_turns 1"},
		{"cap", "    max_cost_usd: 0.0001\n    agent_permissions: {allowed_tools: [Bash]}\n", proto.HoldOverBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.extra)
			vars := []string{"ANTHROPIC_BASE_URL=" + api, "ANTHROPIC_API_KEY=sk-ant-stand-in", "HOME=" + filepath.Join(e.dir, "home"),
				"ORCH_AGENT_SANDBOX=" + os.Getenv("ORCH_TEST_SANDBOX")}
			e.startProcess("A", "claude -p --output-format stream-json --verbose", vars...)
			j := job("claude-"+tc.name, "real-"+tc.name, proto.KindImplement)
			e.enqueue(j)
			st := e.waitState(j.ID, proto.StateFailed, 3*time.Minute)
			if !strings.HasPrefix(st.Error, tc.want) {
				t.Errorf("error %q, want %s", st.Error, tc.want)
			}
			t.Logf("%s: %s (cost %v, turns %d)", tc.name, st.Error, st.SpentUSD, st.Turns)
		})
	}
}
