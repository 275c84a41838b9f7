package runner_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

// costAgent is a stand-in agent that records its run and reports a cost
// of usd as Claude Code's result does.
func costAgent(usd string) string {
	return `echo run >> $RUNS/$ORCH_JOB_ID
echo '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"session_id":"s","result":"ok","total_cost_usd":` + usd + `}'
`
}

// spendOf reads a project's spend in today's window of kind w (UTC).
func (e *env) spendOf(project, w string) float64 {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), proto.BucketSpend)
	if err != nil {
		e.t.Fatal(err)
	}
	en, err := kv.Get(context.Background(), proto.SpendKey(project, w, time.Now(), time.UTC))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0
	}
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := proto.DecodeSpend(en.Value())
	if err != nil {
		e.t.Fatal(err)
	}
	return s.USD
}

// Two jobs of a project with a daily budget of 1.00 each cost 0.60: the
// third is held (over_budget, until the day's end), never reaches the
// agent, is no attempt and leaves no message behind; raising the budget
// and SIGHUP runs it to done, as its first attempt.
func TestBudgetHoldsThenReloadRuns(t *testing.T) {
	e := newEnv(t, "    budget: {daily_usd: 1.00, monthly_usd: 50}\n")
	e.start(e.config("r1", e.script(costAgent("0.6"))))
	for i := range 2 {
		j := job(fmt.Sprintf("budget-%d", i), fmt.Sprintf("task-%d", i), proto.KindImplement)
		e.enqueue(j)
		e.waitState(j.ID, proto.StateDone, 30*time.Second)
	}
	e.waitSpend(proto.WindowDay, 1.2)
	third := job("budget-2", "task-2", proto.KindImplement)
	e.enqueue(third)
	st := e.waitState(third.ID, proto.StateHeld, 30*time.Second)
	midnight := proto.WindowEnd(proto.WindowDay, time.Now(), time.UTC)
	if st.HeldReason != proto.HoldOverBudget || !st.HeldUntil.Equal(midnight) || st.Attempt != 0 || st.Error != "" {
		t.Errorf("held record: reason %q until %v attempt %d error %q; want over_budget until %v, no attempt",
			st.HeldReason, st.HeldUntil, st.Attempt, st.Error, midnight)
	}
	e.waitStreamEmpty(10 * time.Second)
	if ran := e.lines(third.ID); len(ran) != 0 {
		t.Fatalf("held job reached the agent: %v", ran)
	}

	yaml := testkit.RegistryYAML("clone_url: "+e.remote, "default_branch: main") + "    budget: {daily_usd: 5.00, monthly_usd: 50}\n"
	if err := os.WriteFile(e.projects, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	st = e.waitState(third.ID, proto.StateDone, 30*time.Second)
	if ran := e.lines(third.ID); len(ran) != 1 || st.Attempt != 1 {
		t.Errorf("released job ran %d times, as attempt %d; want once, attempt 1", len(ran), st.Attempt)
	}
	e.waitSpend(proto.WindowMonth, 1.8)
}

// waitSpend waits until the project's spend in today's window of kind w
// is usd: the record may say done just before the spend is added.
func (e *env) waitSpend(w string, usd float64) {
	e.t.Helper()
	natstest.CheckFor(e.t, 30*time.Second, 20*time.Millisecond, func() error {
		if got := e.spendOf(testkit.ProjectKey, w); math.Abs(got-usd) > 1e-9 {
			return fmt.Errorf("spend in the %s window %v, want %v", w, got, usd)
		}
		return nil
	})
}

// Two runners racing for a budget's last dollars: the spend recorded is
// the sum of what the jobs that ran cost (no increment lost to the
// other runner's), over the budget by at most one job's cap, and every
// job that did not run is held.
func TestBudgetRaceLosesNoIncrement(t *testing.T) {
	e := newEnv(t, "    budget: {daily_usd: 1.00}\n    max_cost_usd: 0.6\n")
	agent := e.script(costAgent("0.6"))
	e.start(e.config("r1", agent))
	e.start(e.config("r2", agent))
	const n = 6
	for i := range n {
		e.enqueue(job(fmt.Sprintf("race-%d", i), fmt.Sprintf("task-%d", i), proto.KindImplement))
	}
	var sum float64
	ran := 0
	natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		sum, ran = 0, 0
		for i := range n {
			st, _, err := e.status.Get(context.Background(), proto.JobID(fmt.Sprintf("race-%d", i)))
			if err != nil {
				return err
			}
			switch st.State {
			case proto.StateDone:
				sum += st.SpentUSD
				ran++
			case proto.StateHeld:
			default:
				return fmt.Errorf("job %s is %s", st.Job.ID, st.State)
			}
		}
		return nil
	})
	if ran < 2 {
		t.Errorf("%d jobs ran, want at least 2", ran)
	}
	e.waitSpend(proto.WindowDay, sum)
	if got := e.spendOf(testkit.ProjectKey, proto.WindowDay); got > 1.0+0.6+1e-9 {
		t.Errorf("spend %v is over the budget 1.00 by more than one job's cap 0.6", got)
	}
}
