package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// limitAgent meets the account's usage limit on the first run of all
// (the file limited under runs says it was met), reporting it as Claude
// Code does, with resetsAt a few seconds ahead; every run after it
// succeeds. Each run appends its start (Unix nanoseconds) to starts.
const limitAgent = `echo "$(date +%s%N) $ORCH_JOB_ID" >> $RUNS/starts
if mkdir $RUNS/limited 2>/dev/null; then
	reset=$(($(date +%s) + 4))
	echo $reset > $RUNS/reset
	echo '{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":'$reset',"rateLimitType":"five_hour"},"session_id":"s"}'
	echo '{"type":"result","subtype":"success","is_error":true,"num_turns":1,"session_id":"s","result":"You'"'"'ve hit your limit · resets 3pm","total_cost_usd":0}'
	exit 1
fi
echo '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"session_id":"s","result":"ok","total_cost_usd":0.01}'
`

// A usage limit pauses the fleet, not the job: with ORCH_MAX_ATTEMPTS=1
// and two runners, the job that met it is held (usage_limit, until the
// reset) keeping its attempt, a pause of the credential is recorded, no
// agent starts on either runner before the reset, and after it both jobs
// are done, the first as its first attempt.
func TestUsageLimitPausesTheFleet(t *testing.T) {
	e := newEnv(t, "")
	agent := e.script(limitAgent)
	for _, name := range []string{"r1", "r2"} {
		cfg := e.config(name, agent)
		cfg.MaxAttempts = 1
		e.start(cfg)
	}
	first := job("limit-1", "task-1", proto.KindImplement)
	e.enqueue(first)
	st := e.waitState(first.ID, proto.StateHeld, 30*time.Second)
	data, err := os.ReadFile(filepath.Join(e.runs, "reset"))
	if err != nil {
		t.Fatal(err)
	}
	resetSec, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	reset := time.Unix(resetSec, 0)
	if st.HeldReason != proto.HoldUsageLimit || !st.HeldUntil.Equal(reset) || st.Attempt != 0 {
		t.Errorf("held record: reason %q until %v attempt %d; want usage_limit until %v, no attempt used", st.HeldReason, st.HeldUntil, st.Attempt, reset)
	}
	kv, err := e.js.KeyValue(context.Background(), proto.BucketPauses)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var pauses []string
	for k := range keys.Keys() {
		pauses = append(pauses, k)
	}
	if len(pauses) != 1 || !strings.HasPrefix(pauses[0], proto.PauseUsagePrefix) {
		t.Errorf("pauses %v, want one usage pause", pauses)
	}

	second := job("limit-2", "task-2", proto.KindImplement)
	e.enqueue(second)
	e.waitState(first.ID, proto.StateDone, 30*time.Second)
	e.waitState(second.ID, proto.StateDone, 30*time.Second)

	starts := e.lines("starts")
	if len(starts) != 6 {
		t.Fatalf("agent starts %v, want three: the limited run and one per job after the reset", starts)
	}
	for i := 2; i < len(starts); i += 2 {
		ns, _ := strconv.ParseInt(starts[i], 10, 64)
		if at := time.Unix(0, ns); at.Before(reset) {
			t.Errorf("job %s started at %v, before the reset %v", starts[i+1], at, reset)
		}
	}
	if starts[3] != first.ID || starts[5] != second.ID {
		t.Errorf("after the reset ran %s then %s, want the oldest first", starts[3], starts[5])
	}
}
