package runner_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

// A job of a project an operator paused is held (operator), not run, its
// message acked; a held job outlives its runner: with the pause lifted
// while no runner runs, the next runner to start finds it in the status
// bucket and runs it, as its first attempt.
func TestOperatorHoldOutlivesTheRunner(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	pauses, err := e.js.KeyValue(ctx, proto.BucketPauses)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(proto.Pause{Schema: proto.SchemaVersion, Reason: proto.HoldOperator, Since: time.Now().UTC(), By: "alice"})
	if _, err := pauses.Put(ctx, proto.ProjectPauseKey(testkit.ProjectKey), data); err != nil {
		t.Fatal(err)
	}
	agent := e.script(`echo run >> $RUNS/$ORCH_JOB_ID`)
	stop := e.start(e.config("r1", agent))
	j := job("paused-1", "task-1", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateHeld, 30*time.Second)
	if st.HeldReason != proto.HoldOperator || st.Attempt != 0 {
		t.Errorf("held record: reason %q attempt %d, want operator, no attempt", st.HeldReason, st.Attempt)
	}
	e.waitStreamEmpty(10 * time.Second)
	stop()

	if err := pauses.Delete(ctx, proto.ProjectPauseKey(testkit.ProjectKey)); err != nil {
		t.Fatal(err)
	}
	e.start(e.config("r2", agent))
	st = e.waitState(j.ID, proto.StateDone, 30*time.Second)
	if runs := e.lines(j.ID); len(runs) != 1 || st.Attempt != 1 {
		t.Errorf("ran %d times, as attempt %d; want once, attempt 1", len(runs), st.Attempt)
	}
}

// attemptsAgent fails every run; its second run meets the usage limit
// (resetting two seconds ahead) instead.
const attemptsAgent = `echo "$ORCH_ATTEMPT" >> $RUNS/attempts
n=$(wc -l < $RUNS/attempts)
if [ "$n" -eq 2 ]; then
	echo '{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":'$(($(date +%s) + 2))'},"session_id":"s"}'
fi
exit 1
`

// A job published again after a hold still has ORCH_MAX_ATTEMPTS
// attempts in all: with 2, a failed first attempt, a second that met the
// usage limit (no attempt) and a second that failed, the job fails for
// good after three runs, the last as attempt 2, through the usual path
// (its message terminated, none left).
func TestHeldJobKeepsMaxAttemptsInAll(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(attemptsAgent))
	cfg.MaxAttempts = 2
	e.start(cfg)
	j := job("attempts-1", "task-1", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateFailed, time.Minute)
	e.waitStreamEmpty(10 * time.Second)
	if got := e.lines("attempts"); len(got) != 3 || got[0] != "1" || got[1] != "2" || got[2] != "2" || st.Attempt != 2 {
		t.Errorf("runs as attempts %v, record attempt %d; want 1, 2 (usage limit), 2 and attempt 2", got, st.Attempt)
	}
}
