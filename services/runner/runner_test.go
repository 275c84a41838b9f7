package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/agent"
)

// An agent that fails twice then succeeds runs exactly three times, ends
// done, and waits longer before its third run than before its second.
func TestRetriesThenSuccess(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`echo "$(date +%s%N)" >> $RUNS/$ORCH_JOB_ID
test "$(wc -l < $RUNS/$ORCH_JOB_ID)" -ge 3 || exit 4
`))
	cfg.RetryDelay = 400 * time.Millisecond
	e.start(cfg)
	j := job("retry", "task-1", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateDone, 60*time.Second)
	e.waitStreamEmpty(10 * time.Second)
	runs := e.lines(j.ID)
	if len(runs) != 3 || st.Attempt != 3 || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Fatalf("%d runs, status %+v; want 3 runs, attempt 3, exit 0", len(runs), st)
	}
	var at []int64
	for _, r := range runs {
		ns, _ := strconv.ParseInt(r, 10, 64)
		at = append(at, ns)
	}
	gap1, gap2 := time.Duration(at[1]-at[0]), time.Duration(at[2]-at[1])
	// Lower bounds only (a loaded machine makes gaps longer, never
	// shorter): the first retry waits at least 0.8×400ms, the second at
	// least 0.8×800ms.
	if gap1 < 320*time.Millisecond || gap2 < 640*time.Millisecond {
		t.Errorf("gaps between runs %v and %v: want at least 320ms and 640ms", gap1, gap2)
	}
	t.Logf("gaps between runs: %v, %v", gap1, gap2)
}

func TestRetryDelay(t *testing.T) {
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: 10 * time.Second} {
		for range 50 {
			d := runner.RetryDelay(time.Second, 10*time.Second, attempt)
			if d < want*8/10 || d > min(want*12/10, 10*time.Second) {
				t.Fatalf("attempt %d: delay %v, want %v ±20%% capped at 10s", attempt, d, want)
			}
		}
	}
}

// 20 jobs, a limit of 3, two runner processes' worth of runners: never
// more than 3 agents at once, and 3 at some point.
func TestConcurrencyAcrossRunners(t *testing.T) {
	e := newEnv(t, "")
	tr := e.track()
	// The first agents wait (30 s at most) until three runs have started,
	// so that the limit is reached however slowly a loaded machine starts
	// them; the later ones do not wait.
	agentCmd := e.script("SLEEP=0.4\n" + `touch $RUNS/began.$ORCH_JOB_ID.$ORCH_ATTEMPT
i=0
while [ "$(ls $RUNS | grep -c '^began\.')" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
` + trackedAgent)
	for _, name := range []string{"r1", "r2"} {
		cfg := e.config(name, agentCmd)
		cfg.MaxConcurrency = 3
		e.start(cfg)
	}
	var ids []string
	for i := range 20 {
		j := job(fmt.Sprint("conc", i), fmt.Sprint("task-", i), proto.KindImplement)
		ids = append(ids, j.ID)
		e.enqueue(j)
	}
	for _, id := range ids {
		e.waitState(id, proto.StateDone, 120*time.Second)
	}
	e.waitStreamEmpty(10 * time.Second)
	overlap, finished := tr.result()
	if overlap > 3 || overlap < 3 {
		t.Errorf("max overlap %d, want exactly 3 (never more, and reached)", overlap)
	}
	for _, id := range ids {
		if finished[id] != 1 {
			t.Errorf("job %s finished %d times, want 1", id, finished[id])
		}
	}
}

// Cancel of a running job stops its agent and grandchild, records
// cancelled, and terminates the message with reason "cancelled".
func TestCancelRunning(t *testing.T) {
	e := newEnv(t, "")
	e.start(e.config("r1", e.script(`sleep 300 & echo $! > $RUNS/child.pid
echo $$ > $RUNS/agent.pid
wait
`)))
	j := job("cancel-running", "task-c", proto.KindImplement)
	e.enqueue(j)
	agentPid, childPid := e.pid("agent.pid"), e.pid("child.pid")
	e.waitState(j.ID, proto.StateRunning, 10*time.Second)
	if _, err := e.status.Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	testkit.WaitGone(t, agent.Alive, agentPid, childPid)
	e.waitStreamEmpty(10 * time.Second)
	st := e.waitState(j.ID, proto.StateCancelled, 10*time.Second)
	if st.Error != proto.ReasonCancelled {
		t.Errorf("status %+v", st)
	}
	if reason := termReasons(t, e, 1)[0]; reason != proto.ReasonCancelled {
		t.Errorf("term reason %q, want %q", reason, proto.ReasonCancelled)
	}
}

// termReasons waits until JOBS_ADVISORIES holds exactly n MSG_TERMINATED
// advisories and returns their reasons, oldest first.
func termReasons(t *testing.T, e *env, n int) []string {
	t.Helper()
	var reasons []string
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		ctx := context.Background()
		s, err := e.js.Stream(ctx, proto.StreamAdvisories)
		if err != nil {
			return err
		}
		reasons = nil
		state := s.CachedInfo().State
		for seq := state.FirstSeq; state.Msgs > 0 && seq <= state.LastSeq; seq++ {
			raw, err := s.GetMsg(ctx, seq)
			if err != nil {
				return err
			}
			if a, err := proto.DecodeAdvisory(raw.Data); err == nil && a.Type == proto.AdvisoryTerminated {
				reasons = append(reasons, a.Reason)
			}
		}
		if len(reasons) != n {
			return fmt.Errorf("%d terminated advisories %q, want %d", len(reasons), reasons, n)
		}
		return nil
	})
	return reasons
}

// A job cancelled while queued is skipped when pulled: no agent runs.
func TestCancelQueued(t *testing.T) {
	e := newEnv(t, "")
	j := job("cancel-queued", "task-q", proto.KindImplement)
	e.enqueue(j)
	if _, err := e.status.Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	e.start(e.config("r1", e.script(`touch $RUNS/$ORCH_JOB_ID`)))
	e.waitStreamEmpty(10 * time.Second)
	if reason := termReasons(t, e, 1)[0]; reason != proto.ReasonCancelled {
		t.Errorf("term reason %q, want %q", reason, proto.ReasonCancelled)
	}
	if _, err := os.Stat(filepath.Join(e.runs, j.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent ran for a cancelled job")
	}
	e.waitState(j.ID, proto.StateCancelled, time.Second)
}

// A job cancelled while it waits for its project's slot ends cancelled
// then, not once the slot is free: its wait is watched for a cancel as
// a running job is. No agent of it runs.
func TestCancelWhileWaitingForASlot(t *testing.T) {
	e, first, second := waitingForASlot(t, "slot", `touch $RUNS/$ORCH_JOB_ID
while [ ! -e $RUNS/release ]; do sleep 0.05; done
`)
	if _, err := e.status.Cancel(context.Background(), second.ID); err != nil {
		t.Fatal(err)
	}
	if reason := termReasons(t, e, 1)[0]; reason != proto.ReasonCancelled {
		t.Errorf("term reason %q, want %q", reason, proto.ReasonCancelled)
	}
	if st := e.waitState(first.ID, proto.StateRunning, time.Second); st.State != proto.StateRunning {
		t.Errorf("the first job is %s, want it still running", st.State)
	}
	writeFile(t, filepath.Join(e.runs, "release"), "")
	e.waitState(first.ID, proto.StateDone, 10*time.Second)
	e.waitStreamEmpty(10 * time.Second)
	if _, err := os.Stat(filepath.Join(e.runs, second.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent ran for a job cancelled while it waited (%v)", err)
	}
	e.waitState(second.ID, proto.StateCancelled, time.Second)
}

// waitingForASlot starts a runner whose agent is script on a project of
// max_concurrency 1, runs a first job (task "first") and returns once a
// second (task "second") waits for the project's slot. The jobs' ids
// begin with prefix.
func waitingForASlot(t *testing.T, prefix, script string) (e *env, first, second *proto.Job) {
	t.Helper()
	e = newEnv(t, "    max_concurrency: 1\n")
	core, logs := observer.New(zap.InfoLevel)
	cfg := e.config("r1", e.script(script))
	cfg.MaxConcurrency = 2
	e.startLogged(cfg, core)
	first, second = job(prefix+"-first", "first", proto.KindImplement), job(prefix+"-second", "second", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateRunning, 10*time.Second)
	e.enqueue(second)
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, l := range logs.FilterMessageSnippet("waiting for a slot").All() {
			if l.ContextMap()["job"] == second.ID {
				return nil
			}
		}
		return fmt.Errorf("job %s is not waiting for its slot", second.ID)
	})
	return e, first, second
}

// The running state is written while the agent starts: a job whose
// record another runner finished after this one read it (here, while
// it waited for its project's one slot) ends already done. Its record
// stays done, and its agent, started or not, does not run on: the
// message is settled while the agent would still be sleeping.
func TestRecordDoneMeanwhileStopsTheJob(t *testing.T) {
	e, first, second := waitingForASlot(t, "done", `case $ORCH_TASK in
first) while [ ! -e $RUNS/release ]; do sleep 0.05; done ;;
*) touch $RUNS/started; sleep 60; touch $RUNS/finished ;;
esac
`)
	// Another runner's record of the job, done.
	ctx := context.Background()
	st, _, err := e.status.Get(ctx, second.ID)
	if err != nil {
		t.Fatal(err)
	}
	st.State, st.Attempt, st.Runner = proto.StateDone, 1, "elsewhere"
	data, _ := json.Marshal(st)
	if _, err := e.kv.Put(ctx, second.ID, data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.runs, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e.waitState(first.ID, proto.StateDone, 10*time.Second)
	e.waitStreamEmpty(30 * time.Second)
	if st, _, err := e.status.Get(ctx, second.ID); err != nil || st.State != proto.StateDone || st.Runner != "elsewhere" {
		t.Errorf("record of the job done elsewhere: %+v %v", st, err)
	}
	if len(e.lines("finished")) > 0 {
		t.Error("the agent of a job done elsewhere ran to its end")
	}
}

// When the running state's write comes after the agent's start (it is
// not waited for) and finds the job done elsewhere, the agent is stopped
// and nothing of its run is kept: the record stays the other runner's,
// the message is settled while the agent would still be sleeping, and
// the task's saved state is not replaced by this worktree's.
func TestRefusedWriteStopsAStartedAgent(t *testing.T) {
	e := newEnv(t, "")
	started := filepath.Join(e.runs, "started")
	ctx := context.Background()
	j := job("refused-write", "task-refused", proto.KindImplement)
	t.Cleanup(runner.SetBeforeRunningWrite(func(jobID string) {
		if jobID != j.ID {
			return // another test's
		}
		natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			_, err := os.Stat(started)
			return err
		})
		// Another runner's record of the job, done, lands first.
		e.doneElsewhere(jobID)
	}))
	e.start(e.config("r1", e.script(`echo not-kept > kept.txt; touch $RUNS/started; sleep 60; touch $RUNS/finished`)))
	e.enqueue(j)
	e.waitStreamEmpty(30 * time.Second)
	if st, _, err := e.status.Get(ctx, j.ID); err != nil || st.State != proto.StateDone || st.Runner != "elsewhere" {
		t.Errorf("record of the job done elsewhere: %+v %v", st, err)
	}
	if len(e.lines("finished")) > 0 {
		t.Error("the agent ran to its end")
	}
	if m, err := e.readManifest("task-refused"); err != nil || m != nil {
		t.Errorf("the stopped run saved the task's state: %+v %v", m, err)
	}
}

// A job that waited for its task's lock may have been run meanwhile by
// another runner, which the job's record, read before the wait, does not
// say: its agent starts only once its running state is written, and
// here never, the record saying the job is done elsewhere. (A job that
// did not wait starts its agent beside that write:
// TestRefusedWriteStopsAStartedAgent.)
func TestJobDoneWhileItWaitedForItsLock(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	first, second := job("lock-first", "task-waited", proto.KindImplement), job("lock-second", "task-waited", proto.KindImplement)
	hold := filepath.Join(e.runs, "hold")
	writeFile(t, hold, "")
	t.Cleanup(runner.SetBeforeRunningWrite(func(jobID string) {
		if jobID != second.ID {
			return
		}
		// Another runner's record of the job, done, is there when the
		// job has its lock; the write waits a while for an agent started
		// beside it, which would show.
		e.doneElsewhere(jobID)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) && !exists(filepath.Join(e.runs, "started-"+jobID)) {
			time.Sleep(10 * time.Millisecond)
		}
	}))
	cfg := e.config("r1", e.script(`touch $RUNS/started-$ORCH_JOB_ID
while [ "$ORCH_JOB_ID" = lock-first ] && [ -e $RUNS/hold ]; do sleep 0.05; done
`))
	cfg.MaxConcurrency = 2
	e.start(cfg)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateRunning, time.Minute)
	e.enqueue(second)
	natstest.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
		// Delivered: the runner has both messages, the second waiting.
		info, err := e.js.Consumer(ctx, proto.StreamJobs, proto.ConsumerRunner)
		if err != nil {
			return err
		}
		if ci, err := info.Info(ctx); err != nil || ci.NumAckPending != 2 {
			return fmt.Errorf("not both delivered yet (%v)", err)
		}
		return nil
	})
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	e.waitState(first.ID, proto.StateDone, time.Minute)
	e.waitStreamEmpty(time.Minute)
	if st, _, err := e.status.Get(ctx, second.ID); err != nil || st.State != proto.StateDone || st.Runner != "elsewhere" {
		t.Errorf("record of the job done elsewhere: %+v %v", st, err)
	}
	if exists(filepath.Join(e.runs, "started-"+second.ID)) {
		t.Error("the agent of the job done elsewhere started")
	}
}

// The watchdog kills an agent that hangs and its grandchild, and records
// the timeout.
func TestWatchdog(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`sleep 300 & echo $! > $RUNS/child.pid
echo $$ > $RUNS/agent.pid
wait
`))
	cfg.AgentTimeout = 500 * time.Millisecond
	cfg.MaxAttempts = 1
	e.start(cfg)
	j := job("watchdog", "task-w", proto.KindImplement)
	e.enqueue(j)
	agentPid, childPid := e.pid("agent.pid"), e.pid("child.pid")
	st := e.waitState(j.ID, proto.StateFailed, 30*time.Second)
	testkit.WaitGone(t, agent.Alive, agentPid, childPid)
	if !strings.Contains(st.Error, "timeout") || st.Log == "" {
		t.Errorf("status %+v, want a timeout error and a log", st)
	}
	if data, _ := os.ReadFile(st.Log); !strings.Contains(string(data), "timeout") {
		t.Errorf("log %s does not say timeout: %q", st.Log, data)
	}
}

// On success the pipeline's next kind is queued for the same task, once,
// even when the success is delivered again.
func TestPipeline(t *testing.T) {
	e := newEnv(t, "    pipeline: {implement: review}\n")
	e.start(e.config("r1", e.script(`echo "$ORCH_KIND $ORCH_TASK" >> $RUNS/kinds`)))
	j := job("pipe", "task-p", proto.KindImplement)
	e.enqueue(j)
	nextID := proto.JobID("pipeline|" + j.ID + "|review")
	e.waitState(j.ID, proto.StateDone, 30*time.Second)
	next := e.waitState(nextID, proto.StateDone, 30*time.Second)
	if next.Job.Kind != proto.KindReview || next.Job.Task.ID != "task-p" || next.Job.Source.System != "runner" {
		t.Errorf("next job %+v", next.Job)
	}
	// The same success delivered again (as after a lost ack): acked
	// without running, and the review is not queued twice.
	data, _ := os.ReadFile(filepath.Join(e.runs, "kinds"))
	raw := fmt.Sprintf(`{"schema":1,"id":%q,"kind":"implement","project":"widgets","task":{"id":"task-p"}}`, j.ID)
	if _, err := e.js.Publish(context.Background(), proto.JobSubject("widgets", proto.KindImplement), []byte(raw), jetstream.WithMsgID("redelivery")); err != nil {
		t.Fatal(err)
	}
	e.waitStreamEmpty(10 * time.Second)
	if got, _ := os.ReadFile(filepath.Join(e.runs, "kinds")); string(got) != string(data) || string(got) != "implement task-p\nreview task-p\n" {
		t.Errorf("agent runs %q, want one implement and one review", got)
	}
}

// A job that cannot be decoded, or names an unknown project, is
// terminated at once, after its record is written.
func TestTerminateBadJobs(t *testing.T) {
	e := newEnv(t, "")
	e.start(e.config("r1", e.script(`touch $RUNS/ran`)))
	ctx := context.Background()
	ack, err := e.js.Publish(ctx, "jobs.widgets.implement", []byte("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	st := e.waitState("seq-"+strconv.FormatUint(ack.Sequence, 10), proto.StateFailed, 10*time.Second)
	if !strings.Contains(st.Error, "decoding job") {
		t.Errorf("undecodable: %+v", st)
	}
	j := job("unknown", "task-u", proto.KindImplement)
	j.Project = "nobody"
	e.enqueue(j)
	st = e.waitState(j.ID, proto.StateFailed, 10*time.Second)
	if !strings.Contains(st.Error, `unknown project "nobody"`) {
		t.Errorf("unknown project: %+v", st)
	}
	// Two terminations, in order: the undecodable job's, then this one's.
	reasons := termReasons(t, e, 2)
	if id, _ := proto.ParseTermReason(reasons[0]); id != "seq-"+strconv.FormatUint(ack.Sequence, 10) {
		t.Errorf("first term reason %q names %q, want the undecodable message", reasons[0], id)
	}
	if id, cause := proto.ParseTermReason(reasons[1]); id != j.ID || !strings.Contains(cause, "unknown project") {
		t.Errorf("second term reason names %q, %q", id, cause)
	}
	e.waitStreamEmpty(10 * time.Second)
	if _, err := os.Stat(filepath.Join(e.runs, "ran")); err == nil {
		t.Error("an agent ran for a bad job")
	}
}

// Claude Code's result object goes into the status record; is_error fails
// the attempt even with exit 0.
func TestClaudeResultRecorded(t *testing.T) {
	e := newEnv(t, "")
	ok, _ := filepath.Abs("agent/testdata/claude-stream.jsonl")
	bad, _ := filepath.Abs("agent/testdata/claude-stream-error.jsonl")
	cfg := e.config("r1", e.script(fmt.Sprintf(`case "$ORCH_TASK" in good) cat %q;; *) cat %q;; esac`, ok, bad)))
	cfg.MaxAttempts = 1
	e.start(cfg)
	good, failing := job("claude-good", "good", proto.KindReview), job("claude-bad", "bad", proto.KindFix)
	e.enqueue(good)
	e.enqueue(failing)
	st := e.waitState(good.ID, proto.StateDone, 30*time.Second)
	if st.CostUSD != 0.18374925 || st.Turns != 7 || st.SessionID != "5f0f4c2e-8d1b-4f7e-9a57-2c1e0b6d9a31" {
		t.Errorf("status %+v lacks Claude's figures", st)
	}
	if !strings.HasPrefix(st.Result, "The change is small and covered by a new test.") {
		t.Errorf("status result %q, want the agent's final message", st.Result)
	}
	st = e.waitState(failing.ID, proto.StateFailed, 30*time.Second)
	if st.Turns != 31 || !strings.Contains(st.Error, "error_max_turns") || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("status %+v, want a failure from is_error", st)
	}
	if st.Result != "" {
		t.Errorf("failed status carries a result %q; its text belongs in the error", st.Result)
	}
}

// A cleanup job runs no agent and removes the task's worktree and its
// home, with what a confined agent kept there.
func TestCleanup(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`echo "$ORCH_KIND" >> $RUNS/kinds`))
	e.start(cfg)
	impl := job("impl", "task-x", proto.KindImplement)
	e.enqueue(impl)
	e.waitState(impl.ID, proto.StateDone, 30*time.Second)
	dir := filepath.Join(cfg.WorkspaceDir, "worktrees", "widgets", "task-x")
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(cfg.WorkspaceDir, "homes", "widgets", "task-x")
	writeFile(t, filepath.Join(home, ".claude", "projects", "session.jsonl"), "{}\n")
	clean := job("clean", "task-x", proto.KindCleanup)
	e.enqueue(clean)
	e.waitState(clean.ID, proto.StateDone, 30*time.Second)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("worktree still there: %v", err)
	}
	if _, err := os.Stat(home); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the task's home still there: %v", err)
	}
	if got := e.lines("kinds"); len(got) != 1 {
		t.Errorf("agent ran for %v, want only the implement job", got)
	}
}

// Shutdown: a job whose agent outlives the grace is stopped and handed
// back (queued), and another runner then completes it.
func TestShutdownHandsBack(t *testing.T) {
	e := newEnv(t, "")
	agentCmd := e.script(`echo $$ > $RUNS/agent.$ORCH_ATTEMPT.pid
test "$ORCH_ATTEMPT" = 1 && exec sleep 300
exit 0
`)
	cfg := e.config("r1", agentCmd)
	cfg.ShutdownGrace = 300 * time.Millisecond
	stop := e.start(cfg)
	j := job("shutdown", "task-s", proto.KindImplement)
	e.enqueue(j)
	pid := e.pid("agent.1.pid")
	e.waitState(j.ID, proto.StateRunning, 10*time.Second)
	stop()
	if agentAlive := waitQuick(pid); agentAlive {
		t.Errorf("agent %d outlived its runner's shutdown", pid)
	}
	st, _, err := e.status.Get(context.Background(), j.ID)
	if err != nil || st.State != proto.StateQueued {
		t.Fatalf("after shutdown: %+v, %v; want queued", st, err)
	}
	e.start(e.config("r2", agentCmd))
	st = e.waitState(j.ID, proto.StateDone, 30*time.Second)
	if st.Runner != "r2" || st.Attempt != 2 {
		t.Errorf("status %+v, want done by r2 on attempt 2", st)
	}
}

// waitQuick reports whether pid is still alive a moment later.
func waitQuick(pid int) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !agent.Alive(pid) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// A runner that lost its job (a later delivery owns the record) cannot
// move the record back, nor a terminal record to another state.
func TestStaleRunnerCannotOverwrite(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	j := job("stale", "task-z", proto.KindImplement)
	e.enqueue(j)
	// Simulate: a later delivery (attempt 2) has finished the job.
	statustest.Set(t, e.status, j, func(st *proto.Status) {
		st.State, st.Attempt, st.Runner = proto.StateDone, 2, "new"
	})
	// The job's message is delivered again (attempt 1 on this consumer):
	// the runner sees done, acks, and leaves the record alone.
	e.start(e.config("old", e.script(`touch $RUNS/ran`)))
	e.waitStreamEmpty(10 * time.Second)
	st, _, _ := e.status.Get(ctx, j.ID)
	if st.State != proto.StateDone || st.Runner != "new" || st.Attempt != 2 {
		t.Errorf("record %+v was overwritten", st)
	}
	if _, err := os.Stat(filepath.Join(e.runs, "ran")); err == nil {
		t.Error("an agent ran for a done job")
	}
}

// exists reports whether there is a file at path.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// doneElsewhere writes job id's record as another runner ("elsewhere")
// that ran it to done would.
func (e *env) doneElsewhere(id string) {
	ctx := context.Background()
	st, _, err := e.status.Get(ctx, id)
	if err != nil {
		e.t.Error(err)
		return
	}
	st.State, st.Attempt, st.Runner = proto.StateDone, 1, "elsewhere"
	data, _ := json.Marshal(st)
	if _, err := e.kv.Put(ctx, id, data); err != nil {
		e.t.Error(err)
	}
}
