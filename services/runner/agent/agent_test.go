package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/agent"
)

func TestMain(m *testing.M) {
	if os.Getenv(poolOwnerEnv) != "" {
		poolOwner()
	}
	if os.Getenv(prestartOwnerEnv) != "" {
		prestartOwner()
	}
	natstest.VerifyTestMain(m)
}

// script writes a sh script into dir and returns its argv.
func script(t *testing.T, dir, body string) []string {
	t.Helper()
	return []string{"sh", testkit.Script(t, filepath.Join(dir, "agent.sh"), body)}
}

// cancelWhenExists returns a context cancelled with cause once the file
// path exists, or with an error saying never when it has not appeared
// after 30s. The watching goroutine cannot fail the test itself: the
// test's check of the cause reports it. It ends before the test does.
func cancelWhenExists(t *testing.T, path string, cause error, never string) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(nil); wg.Wait() })
	wg.Go(func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if _, err := os.Stat(path); err == nil {
				cancel(cause)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel(errors.New(never))
	})
	return ctx
}

func spec(t *testing.T, argv []string) agent.Spec {
	dir := t.TempDir()
	return agent.Spec{Argv: argv, Dir: dir, Env: agent.Env(agent.EnvAllowDefault), LogPath: filepath.Join(dir, "logs", "1.log"), KillGrace: 200 * time.Millisecond}
}

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	for code, wantErr := range map[int]bool{0: false, 3: true} {
		res := agent.Run(context.Background(), spec(t, script(t, dir, fmt.Sprintf("echo out; echo err >&2; exit %d\n", code))))
		if res.ExitCode != code || (res.Err != nil) != wantErr {
			t.Errorf("exit %d: got %+v", code, res)
		}
	}
	res := agent.Run(context.Background(), spec(t, []string{filepath.Join(dir, "no-such-agent")}))
	if res.Err == nil || res.ExitCode != 127 {
		t.Errorf("missing command: got %+v, want exit 127 with an error", res)
	}
}

// The task text reaches stdin, output reaches the log.
func TestStdinAndLog(t *testing.T) {
	dir := t.TempDir()
	s := spec(t, script(t, dir, "cat; echo done-on-stderr >&2\n"))
	s.Stdin = "# the task\nbody\n"
	if res := agent.Run(context.Background(), s); res.Err != nil {
		t.Fatal(res.Err)
	}
	data, _ := os.ReadFile(s.LogPath)
	if !strings.Contains(string(data), "# the task\nbody\n") || !strings.Contains(string(data), "done-on-stderr") {
		t.Errorf("log = %q", data)
	}
}

// The watchdog stops an agent that hangs, and the grandchild it started,
// even one that left the process group with setsid, and even when the
// agent ignores SIGTERM.
func TestWatchdogKillsGrandchildren(t *testing.T) {
	// The watchdog may fire before a slow machine has run the script as
	// far as its last pid file; then nothing was checked, so run again
	// with twice the timeout until the agent was up when it fired.
	for timeout := 500 * time.Millisecond; ; timeout *= 2 {
		dir := t.TempDir()
		argv := script(t, dir, fmt.Sprintf(`trap '' TERM
sleep 300 & echo $! > %[1]s/child.pid
setsid sleep 300 & echo $! > %[1]s/escaped.pid
echo $$ > %[1]s/agent.pid
while :; do sleep 1; done
`, dir))
		s := spec(t, argv)
		s.Timeout = timeout
		res := agent.Run(context.Background(), s)
		if !errors.Is(res.Err, agent.ErrTimeout) || res.ExitCode != -1 {
			t.Errorf("got %+v, want a timeout", res)
		}
		if _, err := os.Stat(filepath.Join(dir, "agent.pid")); err != nil && timeout < time.Minute {
			t.Logf("the agent was not up after %v: trying again", timeout)
			continue
		}
		testkit.WaitGone(t, agent.Alive, testkit.ReadPid(t, filepath.Join(dir, "agent.pid")), testkit.ReadPid(t, filepath.Join(dir, "child.pid")), testkit.ReadPid(t, filepath.Join(dir, "escaped.pid")))
		if data, _ := os.ReadFile(s.LogPath); !strings.Contains(string(data), "timeout") {
			t.Errorf("log does not say timeout: %q", data)
		}
		return
	}
}

// An agent that exits and leaves a background process behind: it goes too.
func TestLeftoversKilledOnExit(t *testing.T) {
	dir := t.TempDir()
	argv := script(t, dir, fmt.Sprintf("sleep 300 & echo $! > %s/child.pid\nexit 0\n", dir))
	if res := agent.Run(context.Background(), spec(t, argv)); res.Err != nil {
		t.Fatal(res.Err)
	}
	testkit.WaitGone(t, agent.Alive, testkit.ReadPid(t, filepath.Join(dir, "child.pid")))
}

// Cancelling the context stops the agent with the context's cause.
func TestCancel(t *testing.T) {
	dir := t.TempDir()
	argv := script(t, dir, fmt.Sprintf("echo $$ > %s/agent.pid\nexec sleep 300\n", dir))
	cause := errors.New("cancelled")
	ctx := cancelWhenExists(t, filepath.Join(dir, "agent.pid"), cause, "the agent never wrote its pid")
	res := agent.Run(ctx, spec(t, argv))
	if !errors.Is(res.Err, cause) {
		t.Errorf("got %+v, want %v", res, cause)
	}
}

// orch's own secrets never reach the agent; the allowed variables and the
// job's do; the supervisor's marker does not.
func TestEnvAllowList(t *testing.T) {
	secrets := []string{"ORCH_GITEA_SECRET", "ORCH_PLANE_SECRET", "ORCH_API_TOKEN", "ORCH_TELEGRAM_BOT_TOKEN", "ORCH_NATS_CREDS", "NATS_CREDS", "AWS_SECRET_ACCESS_KEY"}
	for _, name := range secrets {
		t.Setenv(name, "s3cr3t-"+name)
	}
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-allowed")
	t.Setenv("EXTRA_ALLOWED", "yes")
	dir := t.TempDir()
	out := filepath.Join(dir, "env.txt")
	s := spec(t, script(t, dir, "env > "+out+"\n"))
	s.Env = agent.Env(append(agent.EnvAllowDefault, "EXTRA_ALLOWED"), "ORCH_JOB_ID=j1", "ORCH_TASK_FILE=/x")
	if res := agent.Run(context.Background(), s); res.Err != nil {
		t.Fatal(res.Err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	env := string(data)
	for _, want := range []string{"ANTHROPIC_API_KEY=sk-ant-allowed", "EXTRA_ALLOWED=yes", "ORCH_JOB_ID=j1", "ORCH_TASK_FILE=/x", "PATH="} {
		if !strings.Contains(env, want) {
			t.Errorf("agent env lacks %s", want)
		}
	}
	for _, name := range secrets {
		if strings.Contains(env, "s3cr3t-"+name) {
			t.Errorf("agent env holds %s", name)
		}
	}
	if strings.Contains(env, "ORCH_INTERNAL") {
		t.Errorf("agent env holds the supervisor marker:\n%s", env)
	}
}

// A recorded Claude Code stream-json transcript yields its result object.
func TestParseClaudeResult(t *testing.T) {
	c, err := agent.ParseClaudeResultFile("testdata/claude-stream.jsonl")
	if err != nil || c == nil {
		t.Fatalf("parse: %v, %v", c, err)
	}
	if c.TotalCostUSD != 0.18374925 || c.NumTurns != 7 || c.IsError || c.SessionID != "5f0f4c2e-8d1b-4f7e-9a57-2c1e0b6d9a31" || c.Err() != nil {
		t.Errorf("result = %+v", c)
	}
	c, err = agent.ParseClaudeResultFile("testdata/claude-stream-error.jsonl")
	if err != nil || c == nil {
		t.Fatalf("parse: %v, %v", c, err)
	}
	if !c.IsError || c.NumTurns != 31 || c.TotalCostUSD != 1.0271 || c.Err() == nil || !strings.Contains(c.Err().Error(), "error_max_turns") {
		t.Errorf("error result = %+v", c)
	}
	if c, err := agent.ParseClaudeResult(strings.NewReader("plain output\n{\"type\":\"other\"}\n")); c != nil || err != nil {
		t.Errorf("non-Claude output parsed as %+v, %v", c, err)
	}
}
