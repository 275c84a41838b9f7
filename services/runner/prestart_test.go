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
	ln := testkit.Listen(t)
	cfg.Listener = ln
	e.start(cfg)
	metrics := "http://" + ln.Addr().String() + "/metrics"

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

// withEnv lists the processes whose environment holds kv.
func withEnv(kv string) []int {
	return processes(func(pid int) bool { return strings.Contains("\x00"+environ(pid), "\x00"+kv+"\x00") })
}
