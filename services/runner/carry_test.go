package runner_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/sandbox"
	"github.com/orch-dev/orch/services/runner/taskstate"
)

// carryAgent writes a stand-in for Claude Code, named claude, that keeps
// its sessions as Claude Code does: under $HOME/.claude/projects/<the
// working directory, every character but letters and digits a dash>/
// <id>.jsonl. With --resume <id> it appends to that session, and refuses
// as Claude Code does when it has no such file ("No conversation found
// with session ID: <id>", exit 1); without, it starts the session
// s-<kind>-<attempt>. It records per run (claude.<job>.<attempt>.<n>) its
// arguments, HOME, working directory, the task file, the session files
// and git's view of the worktree, then, for an implement job, does what
// its task asks:
//
//   - carried, fresh: commit committed.txt (not pushed), change
//     README.md, leave untracked.txt (and ignored.txt, which .gitignore
//     names);
//   - big: commit, and leave a 64 KiB untracked big.bin;
//   - forget: end the run having removed its session file;
//   - refuse: leave a session file it will refuse to resume;
//   - killed: on its first attempt, do the work of carried, say so in
//     killed.ready, and wait to be killed.
//
// It prints a stream-json result with its session id.
func (e *env) carryAgent() string {
	e.t.Helper()
	body := fmt.Sprintf(`RUNS=%s
n=1; while [ -e "$RUNS/claude.$ORCH_JOB_ID.$ORCH_ATTEMPT.$n.args" ]; do n=$((n+1)); done
run=$RUNS/claude.$ORCH_JOB_ID.$ORCH_ATTEMPT.$n
printf '%%s\n' "$@" > $run.args
printf '%%s\n' "$HOME" > $run.home
pwd -P > $run.pwd
cat "$ORCH_TASK_FILE" > $run.task
dir="$HOME/.claude/projects/$(pwd -P | sed 's/[^a-zA-Z0-9]/-/g')"
session=s-$ORCH_KIND-$ORCH_ATTEMPT
prev=""
while [ $# -gt 0 ]; do
  if [ "$1" = --resume ]; then prev=$2; fi
  shift
done
if [ -n "$prev" ]; then
  if [ ! -f "$dir/$prev.jsonl" ] || grep -q unreadable "$dir/$prev.jsonl"; then
    echo "No conversation found with session ID: $prev" >&2
    echo '{"type":"result","subtype":"error_during_execution","is_error":true,"num_turns":0,"session_id":"'$prev'","errors":["No conversation found with session ID: '$prev'"]}'
    exit 1
  fi
  session=$prev
fi
mkdir -p "$dir"
echo "{\"turn\":\"$ORCH_KIND/$ORCH_ATTEMPT\"}" >> "$dir/$session.jsonl"
ls "$dir" > $run.sessions
cat "$dir/$session.jsonl" > $run.transcript
git log --format=%%s > $run.log
git status --porcelain --untracked-files=all > $run.status
cat README.md > $run.readme 2>/dev/null
cat untracked.txt > $run.untracked 2>/dev/null
g="git -c user.name=agent -c user.email=agent@example.com -c commit.gpgsign=false"
case $ORCH_TASK/$ORCH_KIND/$ORCH_ATTEMPT in
carried/implement/*|fresh/implement/*|killed/implement/1)
  echo "committed by $ORCH_TASK" > committed.txt && $g add committed.txt && $g commit -q -m "commit of $ORCH_TASK"
  echo "changed by $ORCH_TASK" >> README.md
  echo "untracked of $ORCH_TASK" > untracked.txt
  echo ignored.txt > .gitignore && $g add .gitignore && $g commit -q -m "ignore"
  echo "ignored" > ignored.txt
  ;;
big/implement/*)
  echo big > committed.txt && $g add committed.txt && $g commit -q -m "commit of $ORCH_TASK"
  head -c 65536 /dev/zero > big.bin
  ;;
forget/implement/*)
  rm -f "$dir/$session.jsonl"
  ;;
refuse/implement/*)
  echo '{"unreadable":true}' > "$dir/$session.jsonl"
  ;;
esac
case $ORCH_TASK/$ORCH_ATTEMPT in
killed/1)
  touch "$RUNS/$ORCH_TASK.ready"
  while :; do sleep 0.1; done
  ;;
esac
echo '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"total_cost_usd":0.001,"session_id":"'$session'","result":"done"}'
`, e.runs)
	return testkit.Script(e.t, filepath.Join(e.dir, "bin", "claude"), body) + " -p --output-format stream-json --verbose"
}

// carryRun is what the stand-in recorded of one run.
type carryRun struct {
	args, home, pwd, task, sessions, transcript, log, status, readme, untracked string
}

func (e *env) carryRun(id string, attempt, n int) carryRun {
	e.t.Helper()
	base := filepath.Join(e.runs, fmt.Sprintf("claude.%s.%d.%d", id, attempt, n))
	read := func(ext string) string {
		data, err := os.ReadFile(base + "." + ext)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			e.t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	if _, err := os.Stat(base + ".args"); err != nil {
		e.t.Fatalf("no run %d of attempt %d of %s: %v", n, attempt, id, err)
	}
	return carryRun{read("args"), read("home"), read("pwd"), read("task"), read("sessions"), read("transcript"),
		read("log"), read("status"), read("readme"), read("untracked")}
}

// manifest reads the task's saved state's manifest, nil when there is
// no state.
func (e *env) manifest(task string) *taskstate.Manifest {
	e.t.Helper()
	m, err := e.readManifest(task)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// readManifest is manifest for a state a runner may be saving meanwhile:
// a read that met a save's replacement of the object fails, and the
// caller reads again.
func (e *env) readManifest(task string) (*taskstate.Manifest, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obj, err := e.js.ObjectStore(ctx, proto.ObjectStoreTaskState)
	if err != nil {
		return nil, err
	}
	data, err := obj.GetBytes(ctx, proto.TaskStateKey("widgets", task))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the state of %s: %w", task, err)
	}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("state of %s: no manifest: %w", task, err)
		}
		if hdr.Name == "manifest.json" {
			var m taskstate.Manifest
			b, _ := io.ReadAll(tr)
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, err
			}
			return &m, nil
		}
	}
}

// A job on runner A commits (not pushed), changes a file, leaves an
// untracked one and a session; A stops. The task's next job runs on B,
// with its own workspace and HOME: it finds the commit, the change, the
// untracked file (not the ignored one), the session under B's worktree's
// name, and is started with --resume <that session>; its task file and
// record say what was restored and from which runner. A cleanup then
// deletes the state.
// Confined, each task has its HOME in the runner's workspace; unconfined
// (ORCH_AGENT_SANDBOX=none) the agents share the runners' HOME, and the
// sessions are told apart by the worktree's path.
func TestTaskStateCarriedToAnotherRunner(t *testing.T) {
	for _, mode := range []sandbox.Mode{sandbox.ModeAuto, sandbox.ModeNone} {
		t.Run(string(mode), func(t *testing.T) { testTaskStateCarried(t, mode) })
	}
}

func testTaskStateCarried(t *testing.T, mode sandbox.Mode) {
	e := newEnv(t, "")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test")) // unconfined agents: never the real ~/.claude
	config := func(name string) runner.Config {
		cfg := e.config(name, agentCmd)
		cfg.AgentSandbox = mode
		return cfg
	}
	stopA := e.start(config("A"))
	first := job("carry-work", "carried", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, 60*time.Second)
	stopA()
	a := e.carryRun(first.ID, 1, 1)
	m := e.manifest("carried")
	if m == nil || m.Runner != "A" || m.Commits != 2 || !m.Changes || m.Untracked != 1 || !m.Session || m.SessionID != "s-implement-1" {
		t.Fatalf("saved state %+v, want A's two commits, changes, one untracked file and session s-implement-1", m)
	}

	e.start(config("B"))
	next := job("carry-next", "carried", proto.KindFix)
	e.enqueue(next)
	st := e.waitState(next.ID, proto.StateDone, 60*time.Second)
	b := e.carryRun(next.ID, 1, 1)
	if b.pwd == a.pwd {
		t.Fatalf("both runs in %s: the runners share a workspace", a.pwd)
	}
	if !strings.Contains(b.args, "--resume\ns-implement-1") {
		t.Errorf("B's agent args:\n%s\nwant --resume s-implement-1", b.args)
	}
	if !strings.Contains(b.log, "commit of carried") {
		t.Errorf("B's worktree log:\n%s\nwant A's unpushed commit", b.log)
	}
	if b.readme != "# widgets\nchanged by carried" || b.untracked != "untracked of carried" {
		t.Errorf("B's README.md %q, untracked.txt %q: want A's uncommitted change and untracked file", b.readme, b.untracked)
	}
	if strings.Contains(b.status, "ignored.txt") {
		t.Errorf("B's worktree has the ignored file: %s", b.status)
	}
	if b.transcript != `{"turn":"implement/1"}`+"\n"+`{"turn":"fix/1"}` {
		t.Errorf("B's session transcript:\n%s\nwant A's turn, then B's", b.transcript)
	}
	want := taskstate.SessionDir(filepath.Join(b.home, ".claude"), b.pwd)
	if _, err := os.Stat(filepath.Join(want, "s-implement-1.jsonl")); err != nil {
		t.Errorf("session not under B's worktree's name: %v", err)
	}
	if !strings.Contains(b.task, "restored from the task's state that runner A saved") || !strings.Contains(b.task, "resuming your earlier session") {
		t.Errorf("B's task file does not say what was restored and resumed:\n%s", b.task)
	}
	if st.Resumed != "s-implement-1" || !strings.Contains(st.Restored, "from runner A") {
		t.Errorf("record: resumed %q, restored %q", st.Resumed, st.Restored)
	}
	if m := e.manifest("carried"); m == nil || m.Runner != "B" {
		t.Errorf("state after B: %+v, want B's", m)
	}

	clean := job("carry-cleanup", "carried", proto.KindCleanup)
	e.enqueue(clean)
	e.waitState(clean.ID, proto.StateDone, 30*time.Second)
	if m := e.manifest("carried"); m != nil {
		t.Errorf("cleanup left the state: %+v", m)
	}
}

// Runner A, a process, is SIGKILLed while its agent runs, after a
// periodic save: the retry on B starts from the saved state (A's commit
// and changes, the session resumed), not from the remote head.
func TestTaskStateSurvivesSIGKILL(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test"))
	a := e.startProcess("A", agentCmd, "HOME="+filepath.Join(e.dir, "home-A"), "ORCH_TASK_STATE_INTERVAL=200ms", "ORCH_ACK_WAIT=3s", "ORCH_AGENT_KILL_GRACE=200ms")
	j := job("carry-wait", "killed", proto.KindImplement)
	e.enqueue(j)
	natstest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if _, err := os.Stat(filepath.Join(e.runs, "killed.ready")); err != nil {
			return err
		}
		// A save that began after the agent's work (runner A may be
		// saving again while it is read).
		m, err := e.readManifest("killed")
		if err != nil {
			return err
		}
		if m == nil || m.Commits != 2 || !m.Changes {
			return fmt.Errorf("no periodic save of the work yet: %+v", m)
		}
		return nil
	})
	a.kill()

	e.start(e.config("B", agentCmd))
	e.waitState(j.ID, proto.StateDone, 60*time.Second)
	b := e.carryRun(j.ID, 2, 1)
	if !strings.Contains(b.log, "commit of killed") || !strings.Contains(b.readme, "changed by killed") || b.untracked != "untracked of killed" {
		t.Errorf("B's retry did not start from A's saved state: log\n%s\nREADME %q, untracked %q", b.log, b.readme, b.untracked)
	}
	if !strings.Contains(b.args, "--resume\ns-implement-1") || !strings.Contains(b.task, "Your previous attempt was interrupted: continue.") {
		t.Errorf("B's retry args:\n%s\ntask:\n%s\nwant the killed attempt's session resumed", b.args, b.task)
	}
}

// Past ORCH_TASK_STATE_MAX_BYTES only the commits and the session are
// saved; the next job gets the commit, not the untracked file, and its
// task file says the changes were left out.
func TestTaskStateOverSizeBound(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test"))
	cfg := e.config("A", agentCmd)
	cfg.TaskStateMaxBytes = 32 << 10
	stopA := e.start(cfg)
	first := job("carry-big", "big", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, 60*time.Second)
	stopA()
	if m := e.manifest("big"); m == nil || m.Omitted == "" || m.Untracked != 0 || m.Commits != 1 || !m.Session {
		t.Fatalf("state %+v, want the commit and the session, the untracked file left out", m)
	}
	cfg = e.config("B", agentCmd)
	cfg.TaskStateMaxBytes = 32 << 10
	e.start(cfg)
	next := job("carry-big-next", "big", proto.KindFix)
	e.enqueue(next)
	e.waitState(next.ID, proto.StateDone, 60*time.Second)
	b := e.carryRun(next.ID, 1, 1)
	if !strings.Contains(b.log, "commit of big") || strings.Contains(b.status, "big.bin") {
		t.Errorf("B's worktree: log\n%s\nstatus\n%s\nwant the commit without big.bin", b.log, b.status)
	}
	if !strings.Contains(b.task, "uncommitted changes and untracked files were not saved") || !strings.Contains(b.task, "ORCH_TASK_STATE_MAX_BYTES") {
		t.Errorf("task file does not say the changes were left out:\n%s", b.task)
	}
}

// A state that cannot be read is a note in the task file and the record,
// and the job runs from the remote head: done, not failed.
func TestTaskStateCorrupt(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test"))
	ctx := context.Background()
	obj, err := e.js.ObjectStore(ctx, proto.ObjectStoreTaskState)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obj.PutBytes(ctx, proto.TaskStateKey("widgets", "corrupt"), []byte("not a tar at all, but long enough to look like something: "+strings.Repeat("x", 1024))); err != nil {
		t.Fatal(err)
	}
	e.start(e.config("B", agentCmd))
	j := job("carry-corrupt", "corrupt", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateDone, 60*time.Second)
	b := e.carryRun(j.ID, 1, 1)
	if !strings.Contains(b.task, "could not be read") || !strings.Contains(b.task, "starts from the remote head") {
		t.Errorf("task file does not say the state could not be read:\n%s", b.task)
	}
	if b.log != "initial" || strings.Contains(b.args, "--resume") {
		t.Errorf("the job did not run fresh from the remote head: log %q, args\n%s", b.log, b.args)
	}
	if !strings.Contains(st.Restored, "could not be read") {
		t.Errorf("record's restored %q", st.Restored)
	}
}

// session: fresh carries the work over but starts a fresh session.
func TestTaskStateSessionFresh(t *testing.T) {
	e := newEnv(t, "    session: fresh\n")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test"))
	stopA := e.start(e.config("A", agentCmd))
	first := job("carry-work-fresh", "fresh", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, 60*time.Second)
	stopA()
	e.start(e.config("B", agentCmd))
	next := job("carry-fresh-next", "fresh", proto.KindFix)
	e.enqueue(next)
	st := e.waitState(next.ID, proto.StateDone, 60*time.Second)
	b := e.carryRun(next.ID, 1, 1)
	if strings.Contains(b.args, "--resume") || st.Resumed != "" {
		t.Errorf("session: fresh resumed: args\n%s\nrecord %q", b.args, st.Resumed)
	}
	if !strings.Contains(b.log, "commit of fresh") {
		t.Errorf("the work was not carried over: %s", b.log)
	}
}

// A session whose transcript is gone is not resumed: one fresh run.
func TestTaskStateSessionGone(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test"))
	e.start(e.config("A", agentCmd))
	first := job("carry-forget", "forget", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, 60*time.Second)
	next := job("carry-forget-next", "forget", proto.KindFix)
	e.enqueue(next)
	st := e.waitState(next.ID, proto.StateDone, 60*time.Second)
	if run := e.carryRun(next.ID, 1, 1); strings.Contains(run.args, "--resume") || st.Resumed != "" {
		t.Errorf("a session without its transcript resumed: args\n%s", run.args)
	}
	if _, err := os.Stat(filepath.Join(e.runs, fmt.Sprintf("claude.%s.1.2.args", next.ID))); err == nil {
		t.Error("the agent ran twice")
	}
}

// A resume the agent refuses (it cannot load the session) runs again, in
// the same attempt, in a fresh session; the job is done.
func TestTaskStateResumeRefused(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.carryAgent()
	t.Setenv("HOME", filepath.Join(e.dir, "home-test"))
	e.start(e.config("A", agentCmd))
	first := job("carry-refuse", "refuse", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, 60*time.Second)
	next := job("carry-refuse-next", "refuse", proto.KindFix)
	e.enqueue(next)
	st := e.waitState(next.ID, proto.StateDone, 60*time.Second)
	refused, fresh := e.carryRun(next.ID, 1, 1), e.carryRun(next.ID, 1, 2)
	if !strings.Contains(refused.args, "--resume\ns-implement-1") || strings.Contains(fresh.args, "--resume") {
		t.Errorf("runs: first args\n%s\nsecond args\n%s\nwant a resume, then a fresh run", refused.args, fresh.args)
	}
	if st.Attempt != 1 || st.Resumed != "" || st.SessionID != "s-fix-1" {
		t.Errorf("record: attempt %d, resumed %q, session %q; want attempt 1 in a fresh session", st.Attempt, st.Resumed, st.SessionID)
	}
}
