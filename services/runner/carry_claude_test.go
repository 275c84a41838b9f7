package runner_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// claudeAPIEnv names a stand-in of the Anthropic API (bench's
// fakeanthropic, script text) for TestRealClaudeResumesOnAnotherRunner;
// unset, the test is skipped: it needs the real Claude Code CLI.
const claudeAPIEnv = "ORCH_TEST_CLAUDE_API"

// The real Claude Code CLI resumes, on runner B, the session it made on
// runner A: B's record says it resumed A's session, and Claude Code
// reports the same session. The stand-in's log shows the resumed
// request carrying the earlier turns (messages=3 and more).
//
//	fakeanthropic -addr 127.0.0.1:0 -script text 2>fake.log
//	ORCH_TEST_CLAUDE_API=http://127.0.0.1:<port> go test -run TestRealClaudeResumesOnAnotherRunner ./services/runner/
func TestRealClaudeResumesOnAnotherRunner(t *testing.T) {
	api := os.Getenv(claudeAPIEnv)
	if api == "" {
		t.Skip(claudeAPIEnv + " is not set: no stand-in API for the real Claude Code CLI")
	}
	if _, err := exec.LookPath("claude"); err != nil {
		t.Skip("no claude on PATH")
	}
	e := newEnv(t, "")
	vars := []string{"ANTHROPIC_BASE_URL=" + api, "ANTHROPIC_API_KEY=sk-ant-stand-in", "ORCH_ACK_WAIT=10s", "ORCH_AGENT_SANDBOX=" + os.Getenv("ORCH_TEST_SANDBOX")}
	const cmd = "claude -p --output-format stream-json --verbose"
	a := e.startProcess("A", cmd, append(vars, "HOME="+filepath.Join(e.dir, "home-A"))...)
	first := job("claude-first", "real", proto.KindImplement)
	e.enqueue(first)
	st1 := e.waitState(first.ID, proto.StateDone, 3*time.Minute)
	a.kill()
	if st1.SessionID == "" {
		t.Fatal("A's record has no session")
	}
	e.startProcess("B", cmd, append(vars, "HOME="+filepath.Join(e.dir, "home-B"))...)
	next := job("claude-next", "real", proto.KindFix)
	e.enqueue(next)
	st2 := e.waitState(next.ID, proto.StateDone, 3*time.Minute)
	if st2.Resumed != st1.SessionID || st2.SessionID != st1.SessionID {
		t.Errorf("B resumed %q and reported session %q; want A's %q", st2.Resumed, st2.SessionID, st1.SessionID)
	}
	t.Logf("A's session %s resumed on B; restored: %s", st1.SessionID, st2.Restored)
}
