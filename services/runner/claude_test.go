package runner_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

// claude writes a stand-in for Claude Code, an executable named claude:
// per run it records its arguments (one a line) and its environment under
// runs, prints the recorded transcript of the real CLI and exits with
// code. It returns the agent command, as ORCH_AGENT_COMMAND would be.
func (e *env) claude(transcript string, code int) string {
	e.t.Helper()
	src, err := filepath.Abs(filepath.Join("agent", "testdata", transcript))
	if err != nil {
		e.t.Fatal(err)
	}
	body := fmt.Sprintf(`run=%s/claude.$ORCH_JOB_ID.$ORCH_ATTEMPT
printf '%%s\n' "$@" > $run.args
env > $run.env
cat %q
exit %d
`, e.runs, src, code)
	return testkit.Script(e.t, filepath.Join(e.dir, "bin", "claude"), body) + " -p --output-format stream-json --verbose"
}

// runsOf returns the files the stand-in wrote for job id, one per run.
func (e *env) runsOf(id string) []string {
	e.t.Helper()
	files, err := filepath.Glob(filepath.Join(e.runs, "claude."+id+".*.args"))
	if err != nil {
		e.t.Fatal(err)
	}
	return files
}

func (e *env) read(path string) string {
	e.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(data)
}

// Claude Code 2.1 prints "type" late in its result object: the record
// still gets the run's cost, turns, session and final message.
func TestClaudeSuccessRecorded(t *testing.T) {
	e := newEnv(t, "")
	e.start(e.config("r1", e.claude("success.jsonl", 0)))
	j := job("claude-success", "task-ok", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateDone, 30*time.Second)
	if st.CostUSD != 0.012 || st.Turns != 2 || st.SessionID != "95ffa790-2771-447b-9146-e8c991415820" {
		t.Errorf("record has cost %v, turns %d, session %q; want 0.012, 2 and the transcript's session", st.CostUSD, st.Turns, st.SessionID)
	}
	if st.Result != "Done: added AGENT_WAS_HERE.md" {
		t.Errorf("record has result %q, want the agent's final message", st.Result)
	}
}

// Some runs can only fail the same way again, so the job fails at once,
// without a second run, with a reason that says what to change; the
// message is terminated with the runner's "<job-id>: <cause>" reason,
// which the notifier alerts on, and is gone, so no later delivery can
// run it. A run in which tools were denied exits 0 but did nothing: the
// reason names the tools and what to allow. Claude Code refuses to bypass
// permissions as root: it prints why and exits 1 without a result; the
// reason says to run the runner as a non-root user.
func TestClaudeRefusalFailsWithoutRetry(t *testing.T) {
	for _, tc := range []struct {
		name, transcript string
		code             int
		job, task        string
		errorSays        []string
		cost             float64 // the run's cost, as the record keeps it
		causeSays        string
	}{
		{
			name: "permission denied", transcript: "permission-denied.jsonl", code: 0, job: "claude-denied", task: "task-denied",
			errorSays: []string{"denied Bash", "allowed_tools: [Bash]", "agent_permissions"},
			cost:      0.012, causeSays: "Bash",
		},
		{
			name: "root refused", transcript: "root-refused-2.1.197.txt", code: 1, job: "claude-root", task: "task-root",
			errorSays: []string{"--dangerously-skip-permissions cannot be used with root/sudo privileges", "non-root user"},
			cost:      0, causeSays: "non-root user",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "")
			cfg := e.config("r1", e.claude(tc.transcript, tc.code))
			cfg.MaxAttempts = 3
			e.start(cfg)
			j := job(tc.job, tc.task, proto.KindImplement)
			e.enqueue(j)
			st := e.waitState(j.ID, proto.StateFailed, 30*time.Second)
			for _, want := range tc.errorSays {
				if !strings.Contains(st.Error, want) {
					t.Errorf("error %q does not say %q", st.Error, want)
				}
			}
			if st.Attempt != 1 || st.ExitCode == nil || *st.ExitCode != tc.code || st.CostUSD != tc.cost {
				t.Errorf("record %+v, want attempt 1, exit code %d and cost %v", st, tc.code, tc.cost)
			}
			id, cause := proto.ParseTermReason(termReasons(t, e, 1)[0])
			if id != j.ID || !strings.Contains(cause, tc.causeSays) {
				t.Errorf("term reason names job %q, cause %q; want %s and %q", id, cause, j.ID, tc.causeSays)
			}
			e.waitStreamEmpty(10 * time.Second)
			if runs := e.runsOf(j.ID); len(runs) != 1 {
				t.Errorf("the agent ran %d times, want once", len(runs))
			}
		})
	}
}

// An API error ends the run with exit 1: the record keeps Claude Code's
// own error text, not only the exit status. Unlike a denial, it may pass,
// so the job is retried.
func TestClaudeAPIErrorRecorded(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.claude("api-error-500.jsonl", 1))
	cfg.MaxAttempts = 2
	e.start(cfg)
	j := job("claude-api-error", "task-api", proto.KindFix)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateFailed, 30*time.Second)
	if !strings.Contains(st.Error, "API Error: 500 fake upstream exploded") || !strings.Contains(st.Error, "api_error") {
		t.Errorf("error %q lacks Claude Code's error text", st.Error)
	}
	if st.ExitCode == nil || *st.ExitCode != 1 || st.SessionID != "0a2e2308-9d14-4a47-abab-3109b005c18e" {
		t.Errorf("record %+v, want exit code 1 and the run's session", st)
	}
	if runs := e.runsOf(j.ID); len(runs) != 2 {
		t.Errorf("the agent ran %d times, want %d (retried)", len(runs), cfg.MaxAttempts)
	}
}

// Claude Code gets the permission flags of the job's kind and the
// project's git identity; an agent that is not Claude Code gets its
// command as configured.
func TestClaudeFlagsAndIdentity(t *testing.T) {
	e := newEnv(t, "    git_author: {name: orch bot, email: bot@example.com}\n"+
		"    agent_permissions:\n      kinds:\n        fix: {mode: plan, allowed_tools: [\"Bash(go test:*)\"]}\n")
	e.start(e.config("r1", e.claude("success.jsonl", 0)))
	review, impl, fix := job("flags-review", "t-review", proto.KindReview), job("flags-impl", "t-impl", proto.KindImplement), job("flags-fix", "t-fix", proto.KindFix)
	for _, j := range []*proto.Job{review, impl, fix} {
		e.enqueue(j)
		e.waitState(j.ID, proto.StateDone, 30*time.Second)
	}
	args := func(j *proto.Job) []string {
		runs := e.runsOf(j.ID)
		if len(runs) != 1 {
			t.Fatalf("%s: %d runs, want 1", j.ID, len(runs))
		}
		return strings.Split(strings.TrimSpace(e.read(runs[0])), "\n")
	}
	has := func(args []string, seq ...string) bool {
		for i := range args {
			if slices.Equal(args[i:min(len(args), i+len(seq))], seq) {
				return true
			}
		}
		return false
	}
	if a := args(review); !has(a, "--permission-mode", "default") || !has(a, "--disallowedTools", "Edit", "Write", "NotebookEdit") ||
		!has(a, "Bash(git diff:*)") || has(a, "Bash") {
		t.Errorf("review ran with %q, want read-only tools and git reading commands", a)
	}
	if a := args(impl); !has(a, "--permission-mode", "acceptEdits") || !has(a, "Bash") || a[0] != "-p" {
		t.Errorf("implement ran with %q, want edits and Bash after the configured flags", a)
	}
	if a := args(fix); !has(a, "--permission-mode", "plan", "--allowedTools", "Bash(go test:*)") {
		t.Errorf("fix ran with %q, want the project's setting for fix", a)
	}
	env := e.read(strings.TrimSuffix(e.runsOf(impl.ID)[0], ".args") + ".env")
	for _, want := range []string{"GIT_AUTHOR_NAME=orch bot", "GIT_AUTHOR_EMAIL=bot@example.com", "GIT_COMMITTER_NAME=orch bot",
		"GIT_COMMITTER_EMAIL=bot@example.com", "CLAUDE_CODE_MAX_RETRIES=4"} {
		if !strings.Contains(env, want+"\n") {
			t.Errorf("agent env lacks %s", want)
		}
	}

	// Another agent: no Claude Code flags, no Claude Code variables.
	e2 := newEnv(t, "")
	e2.start(e2.config("r2", e2.script(`printf '%s\n' "$@" > $RUNS/args; env > $RUNS/env`)))
	other := job("flags-other", "t-other", proto.KindImplement)
	e2.enqueue(other)
	e2.waitState(other.ID, proto.StateDone, 30*time.Second)
	if a := strings.TrimSpace(e2.read(filepath.Join(e2.runs, "args"))); a != "" {
		t.Errorf("a script agent got arguments %q", a)
	}
	if env := e2.read(filepath.Join(e2.runs, "env")); strings.Contains(env, "CLAUDE_CODE_MAX_RETRIES") {
		t.Error("a script agent got CLAUDE_CODE_MAX_RETRIES")
	}
}

// Claude Code that prints no result object and exits non-zero (as root it
// refuses bypassPermissions with one line of text) leaves its words in the
// record's error, not a bare exit status; and what an earlier attempt
// reported (session, turns) does not stay in the record of a later
// attempt that reported nothing.
func TestClaudeWithoutResultRecorded(t *testing.T) {
	e := newEnv(t, "")
	transcript, err := filepath.Abs(filepath.Join("agent", "testdata", "api-error-500-2.1.197.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	refused, err := filepath.Abs(filepath.Join("agent", "testdata", "root-refused-2.1.197.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt fails on the API, the second refuses to start.
	claude := testkit.Script(t, filepath.Join(e.dir, "bin", "claude"),
		fmt.Sprintf("if [ \"$ORCH_ATTEMPT\" = 1 ]; then cat %q; else cat %q; fi\nexit 1\n", transcript, refused))
	cfg := e.config("r1", claude+" -p --output-format stream-json --verbose")
	cfg.MaxAttempts = 2
	e.start(cfg)
	j := job("claude-no-result", "task-refused", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateFailed, 30*time.Second)
	if want := "exit status 1: --dangerously-skip-permissions cannot be used with root/sudo privileges"; !strings.Contains(st.Error, want) {
		t.Errorf("error %q lacks %q", st.Error, want)
	}
	if st.Attempt != 2 || st.SessionID != "" || st.Turns != 0 || st.Result != "" {
		t.Errorf("record %+v, want attempt 2 with no session, turns or result of attempt 1", st)
	}
}
