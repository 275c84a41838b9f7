package runner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/metricstest"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
)

// A confined job in its task's existing worktree has its sandbox made
// beside its admission: its agent starts there once the job may run, in
// the worktree, with its attempt and task text, once. A job that ends
// before it may run (here, cancelled while it waits for its task's lock)
// has its sandbox killed at the gate: its agent never starts. The runner
// counts both.
func TestSandboxMadeAhead(t *testing.T) {
	testkit.RequireBwrap(t)
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`echo "$ORCH_ATTEMPT $(pwd)" > $RUNS/$ORCH_JOB_ID.start
cat > $RUNS/$ORCH_JOB_ID.stdin
while [ -e $RUNS/hold-$ORCH_JOB_ID ]; do sleep 0.05; done
`))
	cfg.MaxConcurrency = 2
	metrics := e.startScraped(cfg)

	// The first job makes the task's worktree: nothing is made ahead.
	first := job("ahead-1", "task-ahead", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, time.Minute)

	// The second runs in it until the test lets it end; the third waits
	// for the task's lock meanwhile, its sandbox made, and is cancelled.
	second, third := job("ahead-2", "task-ahead", proto.KindImplement), job("ahead-3", "task-ahead", proto.KindImplement)
	hold := filepath.Join(e.runs, "hold-"+second.ID)
	writeFile(t, hold, "")
	e.enqueue(second)
	e.waitState(second.ID, proto.StateRunning, time.Minute)
	e.enqueue(third)
	var gated []int
	natstest.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
		if gated = withEnv("ORCH_JOB_ID=" + third.ID); len(gated) == 0 {
			return errors.New("no sandbox made for the waiting job")
		}
		return nil
	})
	if _, err := e.status.Cancel(context.Background(), third.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(third.ID, proto.StateCancelled, time.Minute)
	natstest.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
		if left := withEnv("ORCH_JOB_ID=" + third.ID); len(left) > 0 {
			return fmt.Errorf("the cancelled job's sandbox %v lives on", left)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(e.runs, third.ID+".start")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cancelled job's agent started (%v)", err)
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	e.waitState(second.ID, proto.StateDone, time.Minute)

	worktree := filepath.Join(cfg.WorkspaceDir, "worktrees", "widgets", "task-ahead")
	for _, j := range []*proto.Job{first, second} {
		start, _ := os.ReadFile(filepath.Join(e.runs, j.ID+".start"))
		if want := "1 " + worktree + "\n"; string(start) != want {
			t.Errorf("job %s's agent says %q, want %q", j.ID, start, want)
		}
		if stdin, _ := os.ReadFile(filepath.Join(e.runs, j.ID+".stdin")); !bytes.Contains(stdin, []byte("Body of task-ahead")) {
			t.Errorf("job %s's agent read %q, not its task text", j.ID, stdin)
		}
	}
	m := metricstest.Scrape(t, metrics)
	for result, want := range map[string]float64{"used": 1, "ended": 1} {
		if v, _ := m.Value(`orch_runner_sandboxes_ahead_total{result="` + result + `"}`); v != want {
			t.Errorf("orch_runner_sandboxes_ahead_total{result=%q} = %v, want %v", result, v, want)
		}
	}
}

// A confined job of a new task that will take the project's spare
// worktree has its sandbox made on the spare beside its admission, bound
// where the task's worktree is to be. Its agent starts there once the
// spare is the task's: in the task's worktree, on the task's branch, and
// what it commits is on that branch in the runner's clone. A new task
// that does not take the spare has that sandbox ended unused.
func TestSandboxMadeAheadOnTheSpare(t *testing.T) {
	testkit.RequireBwrap(t)
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`echo "$(pwd) $(git rev-parse --abbrev-ref HEAD)" > $RUNS/$ORCH_JOB_ID.start
cat > $RUNS/$ORCH_JOB_ID.stdin
echo "$ORCH_JOB_ID" > agent.txt
git add agent.txt && git -c user.name=agent -c user.email=agent@example.com commit -qm "by $ORCH_JOB_ID"
`))
	metrics := e.startScraped(cfg)
	// spares waits until n spare worktrees were made.
	spares := func(n float64) {
		t.Helper()
		natstest.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
			m := metricstest.Scrape(t, metrics)
			if v, _ := m.Value(`orch_runner_spare_worktrees_made_total{project="widgets"}`); v < n {
				return fmt.Errorf("%v spare worktrees made, want %v", v, n)
			}
			return nil
		})
	}

	// The first new task finds no spare (nothing made ahead); the spare
	// is made when it ends.
	first := job("spare-1", "task-first", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, time.Minute)
	spares(1)

	second := job("spare-2", "task-second", proto.KindImplement)
	e.enqueue(second)
	if st := e.waitState(second.ID, proto.StateDone, time.Minute); st.Attempt != 1 {
		t.Errorf("the new task's job was done at attempt %d, want its first", st.Attempt)
	}
	worktree := filepath.Join(cfg.WorkspaceDir, "worktrees", "widgets", "task-second")
	branch := git(t, worktree, "rev-parse", "--abbrev-ref", "HEAD")
	start, _ := os.ReadFile(filepath.Join(e.runs, second.ID+".start"))
	if want := worktree + " " + branch + "\n"; string(start) != want {
		t.Errorf("the agent says %q, want %q", start, want)
	}
	if stdin, _ := os.ReadFile(filepath.Join(e.runs, second.ID+".stdin")); !bytes.Contains(stdin, []byte("Body of task-second")) {
		t.Errorf("the agent read %q, not its task text", stdin)
	}
	if got := git(t, worktree, "log", "-1", "--format=%s", branch); got != "by "+second.ID {
		t.Errorf("the task's branch %s ends at %q, want the agent's commit", branch, got)
	}

	// Once the next spare is made, main moves on: a new task then starts
	// at main's new head and does not take the spare. The sandbox made on
	// the spare is ended, and the agent starts in a worktree of the
	// task's own.
	spares(2)
	writeFile(t, filepath.Join(e.remote, "moved.txt"), "moved\n")
	git(t, e.remote, "add", "moved.txt")
	git(t, e.remote, "commit", "-q", "-m", "main moves on")
	third := job("spare-3", "task-third", proto.KindImplement)
	e.enqueue(third)
	if st := e.waitState(third.ID, proto.StateDone, time.Minute); st.Attempt != 1 {
		t.Errorf("the third job was done at attempt %d, want its first", st.Attempt)
	}
	worktree = filepath.Join(cfg.WorkspaceDir, "worktrees", "widgets", "task-third")
	branch = git(t, worktree, "rev-parse", "--abbrev-ref", "HEAD")
	start, _ = os.ReadFile(filepath.Join(e.runs, third.ID+".start"))
	if want := worktree + " " + branch + "\n"; string(start) != want {
		t.Errorf("the third agent says %q, want %q", start, want)
	}
	if got := git(t, worktree, "log", "-2", "--format=%s", branch); got != "by "+third.ID+"\nmain moves on" {
		t.Errorf("the third task's branch %s ends with %q, want the agent's commit on main's new head", branch, got)
	}

	m := metricstest.Scrape(t, metrics)
	for result, want := range map[string]float64{"used": 1, "ended": 1} {
		if v, _ := m.Value(`orch_runner_sandboxes_ahead_total{result="` + result + `"}`); v != want {
			t.Errorf("orch_runner_sandboxes_ahead_total{result=%q} = %v, want %v", result, v, want)
		}
	}
}

// withEnv lists the processes whose environment holds kv.
func withEnv(kv string) []int {
	return processes(func(pid int) bool { return strings.Contains("\x00"+environ(pid), "\x00"+kv+"\x00") })
}

// startScraped starts a runner with cfg, serving its metrics, and returns
// their address.
func (e *env) startScraped(cfg runner.Config) (metrics string) {
	ln := testkit.Listen(e.t)
	cfg.Listener = ln
	e.start(cfg)
	return "http://" + ln.Addr().String() + "/metrics"
}
