package runner_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// A runner process SIGKILLed while its agent runs: another runner starts
// the job's next agent within AckWait + 10 s of the kill, and not while
// any process of the first agent is alive. Once with the default AckWait
// and kill grace, once with short ones.
func TestCrashedRunnersJobRunsAgainWithinAckWait(t *testing.T) {
	defaults := service.Default[runner.Config]()
	for _, tc := range []struct {
		name               string
		ackWait, killGrace time.Duration
		vars               []string
	}{
		{"default AckWait", defaults.AckWait, defaults.KillGrace, nil},
		{"short AckWait", 2 * time.Second, 200 * time.Millisecond, []string{"ORCH_ACK_WAIT=2s", "ORCH_AGENT_KILL_GRACE=200ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "")
			// The first attempt runs until killed. A later one records when
			// it started, then whether a process of the first is alive
			// (zombies count as gone).
			agentCmd := e.script(`if test "$ORCH_ATTEMPT" = 1; then
  sleep 300 & echo $! > $RUNS/child.pid
  echo $$ > $RUNS/agent.1.pid
  wait
  exit 0
fi
date +%s%N > $RUNS/restarted
for p in $(cat $RUNS/agent.1.pid $RUNS/child.pid); do
  if test -r /proc/$p/stat && ! sed 's/^.*) //' /proc/$p/stat | grep -q '^[ZX]'; then
    echo $p >> $RUNS/alive-at-restart
  fi
done
`)
			// Unconfined: the second agent looks for the first one's
			// processes in /proc, which a sandbox's own pid namespace
			// would hide (TestRunnerSIGKILL runs confined).
			proc := e.startProcess("crashed", agentCmd, append(tc.vars, "ORCH_AGENT_SANDBOX=none")...)
			j := job("crash-"+strings.ReplaceAll(tc.name, " ", "-"), "task-crash", proto.KindImplement)
			e.enqueue(j)
			first, child := e.pid("agent.1.pid"), e.pid("child.pid")
			e.waitState(j.ID, proto.StateRunning, 30*time.Second)

			killed := time.Now()
			proc.kill()
			cfg := e.config("after", agentCmd)
			cfg.AckWait, cfg.KillGrace = tc.ackWait, tc.killGrace
			cfg.AgentSandbox = sandbox.ModeNone
			e.start(cfg)

			st := e.waitState(j.ID, proto.StateDone, tc.ackWait+60*time.Second)
			if st.Runner != "after" || st.Attempt < 2 {
				t.Errorf("status %+v, want done by the new runner", st)
			}
			testkit.WaitGone(t, agent.Alive, first, child)
			if alive := e.lines("alive-at-restart"); len(alive) > 0 {
				t.Errorf("processes %v of the first agent (%d, %d) were alive when the second started", alive, first, child)
			}
			restarted := e.lines("restarted")
			if len(restarted) != 1 {
				t.Fatalf("the agent ran again %d times, want once", len(restarted))
			}
			ns, err := strconv.ParseInt(restarted[0], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			took := time.Unix(0, ns).Sub(killed)
			t.Logf("AckWait %v, kill grace %v: the next agent started %v after the kill", tc.ackWait, tc.killGrace, took.Round(time.Millisecond))
			if limit := tc.ackWait + 10*time.Second; took > limit {
				t.Errorf("the next agent started %v after the kill, want within %v", took, limit)
			}
		})
	}
}

// Two jobs of one task run in the same worktree on agent/<task>, one after
// the other, never at once; the second sees the first one's commit. Each
// agent runs longer than AckWait plus the kill grace, so the waiting job
// sees a lock held well past the stale age: the holder's heartbeat keeps
// it fresh, and it is never taken over.
func TestSameTaskNeverAtOnce(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`f=$RUNS/$ORCH_JOB_ID
echo "start $(date +%s%N)" > $f
echo "dir $(pwd)" >> $f
echo "branch $(git rev-parse --abbrev-ref HEAD)" >> $f
echo "commits $(git rev-list --count HEAD)" >> $f
sleep 4
git -c user.name=agent -c user.email=agent@example.com commit -q --allow-empty -m "$ORCH_KIND"
echo "end $(date +%s%N)" >> $f
`))
	cfg.MaxConcurrency = 2 // agents of 4s, past the harness's AckWait of 3s and the kill grace
	e.start(cfg)
	a, b := job("same-a", "shared", proto.KindImplement), job("same-b", "shared", proto.KindRespond)
	e.enqueue(a)
	e.enqueue(b)
	e.waitState(a.ID, proto.StateDone, 60*time.Second)
	e.waitState(b.ID, proto.StateDone, 60*time.Second)

	read := func(id string) map[string]string {
		data, err := os.ReadFile(filepath.Join(e.runs, id))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			k, v, _ := strings.Cut(line, " ")
			m[k] = v
		}
		return m
	}
	ra, rb := read(a.ID), read(b.ID)
	wantDir := filepath.Join(cfg.WorkspaceDir, "worktrees", "widgets", "shared")
	for _, r := range []map[string]string{ra, rb} {
		if r["dir"] != wantDir || r["branch"] != "agent/shared" {
			t.Errorf("run in %s on %s, want %s on agent/shared", r["dir"], r["branch"], wantDir)
		}
	}
	first, second := ra, rb
	if ra["start"] > rb["start"] {
		first, second = rb, ra
	}
	if second["start"] < first["end"] {
		t.Errorf("the runs overlap: %v and %v", first, second)
	}
	// Each run commits once. A run the lease took away (a loaded machine)
	// runs again and commits again, so only the order is certain: the
	// later run sees the earlier one's commit on top of the initial one.
	n1, _ := strconv.Atoi(first["commits"])
	n2, _ := strconv.Atoi(second["commits"])
	if n1 < 1 || n2 <= n1 {
		t.Errorf("commits seen: %d then %d, want the second run to see the first's commit (the worktree is reused)", n1, n2)
	}
}

// A runner process killed with SIGKILL while its agent runs leaves no
// agent, no grandchild (not even one that left the process group), and the
// job completes on a new runner.
func TestRunnerSIGKILL(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.script(`echo $$ > $RUNS/agent.$ORCH_ATTEMPT.pid
if test "$ORCH_ATTEMPT" = 1; then
  sleep 300 & echo $! > $RUNS/child.pid
  setsid sleep 300 & echo $! > $RUNS/escaped.pid
  wait
fi
exit 0
`)
	proc := e.startProcess("proc", agentCmd, "ORCH_ACK_WAIT=1s", "ORCH_AGENT_KILL_GRACE=200ms")
	j := job("sigkill", "task-k", proto.KindImplement)
	e.enqueue(j)
	pids := []int{e.pid("agent.1.pid"), e.pid("child.pid"), e.pid("escaped.pid")}
	for _, pid := range pids {
		if !agent.Alive(pid) {
			t.Fatalf("process %d not running before the kill", pid)
		}
	}
	proc.kill()
	testkit.WaitGone(t, agent.Alive, pids...)

	e.start(e.config("after", agentCmd))
	st := e.waitState(j.ID, proto.StateDone, 60*time.Second)
	if st.Runner != "after" || st.Attempt < 2 {
		t.Errorf("status %+v, want done by the new runner", st)
	}
}

// JetStream restarted while agents run, once briefly and once kept down
// past AckWait: never more agents than the limit at once, and every job
// finishes exactly once.
func TestJetStreamRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		down time.Duration
	}{{"quick restart", 0}, {"down past AckWait", 4 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "")
			tr := e.track()
			cfg := e.config("r1", e.script("SLEEP=3\n"+trackedAgent))
			cfg.MaxConcurrency = 3
			cfg.AckWait = 1500 * time.Millisecond
			e.start(cfg)
			var ids []string
			for i := range 5 {
				j := job(fmt.Sprint(tc.name, i), fmt.Sprint("task-", i), proto.KindImplement)
				ids = append(ids, j.ID)
				e.enqueue(j)
			}
			natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
				files, _ := filepath.Glob(filepath.Join(e.runs, "run.*"))
				if len(files) < 3 {
					return fmt.Errorf("%d agents started", len(files))
				}
				return nil
			})
			e.srv.Shutdown()
			time.Sleep(tc.down) // the outage itself, not a wait for a result
			if err := e.srv.Start(); err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				e.waitState(id, proto.StateDone, 90*time.Second)
			}
			e.waitStreamEmpty(30 * time.Second)
			overlap, finished := tr.result()
			if overlap > 3 {
				t.Errorf("max overlap %d, want at most 3", overlap)
			}
			for _, id := range ids {
				if finished[id] != 1 {
					t.Errorf("job %s finished %d times, want 1", id, finished[id])
				}
			}
			t.Logf("max overlap %d", overlap)
		})
	}
}
