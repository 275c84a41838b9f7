package runner

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/services/runner/agent"
)

// TestDecide takes every outcome of a delivery to decide, on a first, a
// middle and a last attempt, and checks the verdict: what is done with
// the message, what the record is written with, what is counted.
func TestDecide(t *testing.T) {
	lim := limits{maxAttempts: 3, retryDelay: time.Second, retryMaxDelay: 10 * time.Second}
	exit1 := errors.New("agent exited: exit status 1")
	outcomes := map[string]outcome{
		"exit 0":               {end: ranToEnd},
		"exit 1":               {end: ranToEnd, exitCode: 1, err: exit1},
		"timeout":              ended(agent.Result{ExitCode: -1, Err: fmt.Errorf("%w after 1m0s", agent.ErrTimeout)}, nil),
		"denied":               {end: ranToEnd, err: fmt.Errorf("Claude Code was denied Bash: %w", agent.ErrPermissionDenied)},
		"not prepared":         unprepared(errors.New("preparing worktree: clone failed")),
		"cannot run":           {end: cannotRun, exitCode: -1, err: errors.New("unknown project \"x\"")},
		"cancelled before run": {end: cancelledBeforeRun},
		"cancelled":            ended(agent.Result{ExitCode: -1, Err: errCancelled}, nil),
		"already done":         {end: alreadyDone},
		"superseded":           {end: superseded, exitCode: -1},
		"lease lost":           ended(agent.Result{ExitCode: -1, Err: errLeaseLost}, nil),
		"lock lost":            unprepared(errLockLost),
		"shutdown":             ended(agent.Result{ExitCode: -1, Err: errShutdown}, nil),
		"shutdown preparing":   unprepared(errShutdown),
		"on hold":              {end: onHold, exitCode: -1, holdReason: "over_budget"},
		"usage limit":          {end: usageLimited, exitCode: 1, err: exit1, holdReason: "usage_limit", holdUntil: time.Unix(1e9, 0)},
		"over budget":          ended(agent.Result{ExitCode: -1, Err: fmt.Errorf("spent $1.20 past max_cost_usd $1.00: %w", errOverBudget)}, nil),
		"republished exit 1":   {end: ranToEnd, exitCode: 1, err: exit1, republished: true},
		"max turns":            {end: ranToEnd, exitCode: 1, err: fmt.Errorf("%w: 13 turns", errMaxTurns)},
	}
	// want[outcome] is the verdict on attempts 1, 2 and 3 (the last).
	want := map[string][3]string{
		//                         attempt 1                                       attempt 2                                       attempt 3 (last)
		"exit 0":               {"ack record=finish count=done", "ack record=finish count=done", "ack record=finish count=done"},
		"exit 1":               {"retry after 1s record=retry count=retry", "retry after 2s record=retry count=retry", "fail record=fail count=failed"},
		"timeout":              {"retry after 1s record=retry count=retry", "retry after 2s record=retry count=retry", "fail record=fail count=failed"},
		"denied":               {"terminate record=fail count=failed", "terminate record=fail count=failed", "terminate record=fail count=failed"},
		"not prepared":         {"retry after 1s record=retry count=retry", "retry after 2s record=retry count=retry", "fail record=fail count=failed"},
		"cannot run":           {"terminate record=reject count=failed", "terminate record=reject count=failed", "terminate record=reject count=failed"},
		"cancelled before run": {"terminate cancelled record=- count=cancelled", "terminate cancelled record=- count=cancelled", "terminate cancelled record=- count=cancelled"},
		"cancelled":            {"terminate cancelled record=stopped count=cancelled", "terminate cancelled record=stopped count=cancelled", "terminate cancelled record=stopped count=cancelled"},
		"already done":         {"ack record=- count=", "ack record=- count=", "ack record=- count="},
		"superseded":           {"leave alone record=- count=lost_lease", "leave alone record=- count=lost_lease", "leave alone record=- count=lost_lease"},
		"lease lost":           {"leave alone record=- count=lost_lease", "leave alone record=- count=lost_lease", "leave alone record=- count=lost_lease"},
		"lock lost":            {"leave alone record=- count=lost_lease", "leave alone record=- count=lost_lease", "leave alone record=- count=lost_lease"},
		"shutdown":             {"hand back record=requeue count=handed_back", "hand back record=requeue count=handed_back", "hand back record=requeue count=handed_back"},
		"shutdown preparing":   {"hand back record=requeue count=handed_back", "hand back record=requeue count=handed_back", "hand back record=requeue count=handed_back"},
		"on hold":              {"hold record=hold count=held", "hold record=hold count=held", "hold record=hold count=held"},
		"usage limit":          {"hold record=hold count=held", "hold record=hold count=held", "hold record=hold count=held"},
		"over budget":          {"terminate record=fail count=failed", "terminate record=fail count=failed", "terminate record=fail count=failed"},
		"republished exit 1":   {"retry after 1s record=retry count=retry", "retry after 2s record=retry count=retry", "terminate record=fail count=failed"},
		"max turns":            {"terminate record=fail count=failed", "terminate record=fail count=failed", "terminate record=fail count=failed"},
	}
	if len(want) != len(outcomes) {
		t.Fatalf("table has %d rows for %d outcomes", len(want), len(outcomes))
	}
	for name, out := range outcomes {
		row, ok := want[name]
		if !ok {
			t.Fatalf("no row for outcome %q", name)
		}
		for i, w := range row {
			attempt := i + 1
			t.Run(fmt.Sprintf("%s/attempt %d", name, attempt), func(t *testing.T) {
				v := decide(out, attempt, lim)
				if got := v.String(); got != w {
					t.Errorf("verdict %q, want %q", got, w)
				}
				if v.note == "" {
					t.Error("verdict logs nothing")
				}
			})
		}
	}

	// The retry delay doubles up to its cap, and 0 retries at once.
	for _, tc := range []struct {
		lim     limits
		attempt int
		want    time.Duration
	}{
		{limits{maxAttempts: 9, retryDelay: time.Second, retryMaxDelay: 5 * time.Second}, 4, 5 * time.Second},
		{limits{maxAttempts: 9, retryDelay: 0, retryMaxDelay: 5 * time.Second}, 4, 0},
	} {
		if v := decide(outcomes["exit 1"], tc.attempt, tc.lim); v.do != retryAfter || v.delay != tc.want {
			t.Errorf("attempt %d under %+v: %v, want a retry after %v", tc.attempt, tc.lim, v, tc.want)
		}
	}
}
