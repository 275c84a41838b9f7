package runner_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// overCapAgent prints an assistant message whose usage prices at $1.00
// (40,000 output tokens of claude-opus-4-8 at $25 a million), notes when,
// and would then work on for half a minute.
const overCapAgent = `echo run >> $RUNS/$ORCH_JOB_ID
echo '{"type":"assistant","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-8","content":[{"type":"text","text":"working"}],"usage":{"input_tokens":0,"output_tokens":40000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}},"session_id":"s"}'
date +%s%N > $RUNS/over
sleep 30
echo '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"session_id":"s","result":"ok","total_cost_usd":1}'
`

// An agent whose stream shows its spend passing max_cost_usd is stopped
// within a second of that line; the job fails for good with reason
// over_budget (no retry spends again), and what it spent is counted.
func TestSpendCapStopsAgent(t *testing.T) {
	e := newEnv(t, "    max_cost_usd: 0.5\n")
	e.start(e.config("r1", e.script(overCapAgent)))
	j := job("over-cap", "task-1", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateFailed, 30*time.Second)
	over := e.lines("over")
	if len(over) != 1 {
		t.Fatalf("the agent did not note its spend line: %v", over)
	}
	ns, _ := strconv.ParseInt(over[0], 10, 64)
	if took := st.FinishedAt.Sub(time.Unix(0, ns)); took > time.Second {
		t.Errorf("agent stopped %v after its spend passed the cap, want within a second", took)
	}
	if !strings.HasPrefix(st.Error, proto.HoldOverBudget) || st.SpentUSD < 1 {
		t.Errorf("record: error %q, spent %v; want over_budget and the $1.00 seen", st.Error, st.SpentUSD)
	}
	e.waitStreamEmpty(10 * time.Second)
	if runs := e.lines(j.ID); len(runs) != 1 {
		t.Errorf("agent ran %d times, want once: no retry", len(runs))
	}
}

// turnsAgent prints three assistant messages (three turns) and would
// then work on.
const turnsAgent = `echo run >> $RUNS/$ORCH_JOB_ID
for i in 1 2 3; do
	echo '{"type":"assistant","message":{"id":"msg_'$i'","type":"message","role":"assistant","model":"claude-opus-4-8","content":[{"type":"text","text":"turn"}]},"session_id":"s"}'
done
sleep 30
`

// The turns orch counts are held to max_turns: past it the agent is
// stopped and the job fails for good.
func TestMaxTurnsStopsAgent(t *testing.T) {
	e := newEnv(t, "    max_turns: 2\n")
	e.start(e.config("r1", e.script(turnsAgent)))
	j := job("max-turns", "task-1", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateFailed, 20*time.Second)
	if !strings.HasPrefix(st.Error, "max_turns") {
		t.Errorf("error %q, want max_turns", st.Error)
	}
	e.waitStreamEmpty(10 * time.Second)
	if runs := e.lines(j.ID); len(runs) != 1 {
		t.Errorf("agent ran %d times, want once", len(runs))
	}
}
