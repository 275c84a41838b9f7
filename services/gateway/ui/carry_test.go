package ui_test

import (
	"strings"
	"testing"

	"github.com/orch-dev/orch/proto"
)

// The job page says whether the attempt resumed the agent's session and
// what of the task's saved state it began with.
func TestJobPageSaysWhatWasCarriedOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	e.put(proto.Status{Job: job("j1", "pr-1", "t"), State: proto.StateDone, Attempt: 1, Runner: "B", SessionID: "s-1",
		Resumed: "s-1", Restored: "1 commit not on the remote and the agent's session from runner A " + evil})
	a := e.loggedIn().get("/ui/jobs/j1")
	for _, want := range []string{"resumed <code>s-1</code>", "1 commit not on the remote and the agent&#39;s session from runner A &lt;script&gt;"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("job page lacks %q", want)
		}
	}
	e.put(proto.Status{Job: job("j2", "pr-2", "t"), State: proto.StateDone, Attempt: 1, SessionID: "s-2"})
	if a := e.loggedIn().get("/ui/jobs/j2"); strings.Contains(a.body, "Restored") || strings.Contains(a.body, "resumed") || !strings.Contains(a.body, "<code>s-2</code>") {
		t.Errorf("a fresh attempt's page: %s", a.body)
	}
}
