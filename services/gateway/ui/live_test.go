package ui_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/ui"
)

// The page's script re-reads the job page every 2 s with X-Orch-Live; the
// answer carries the status but no log, so an open page does not read the
// logs of every attempt again and again. The logs section keeps its key,
// which tells the script when to read the whole page once.
func TestALivePollOfTheJobPageReadsNoLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	const words = "the agent reads the failing test"
	e.writeLog("j1", 1, "attempt one: "+words+"\n")
	e.writeLog("j1", 2, "attempt two: "+words+"\n")
	e.put(proto.Status{Job: job("j1", "pr-1", "Fix it"), State: proto.StateRunning, Attempt: 2, Runner: "build-07",
		StartedAt: time.Now().Add(-time.Minute)})
	c := e.loggedIn()

	whole := c.get("/ui/jobs/j1")
	if whole.code != http.StatusOK || strings.Count(whole.body, words) != 2 {
		t.Fatalf("the whole page (%d) should show both attempts' logs:\n%s", whole.code, whole.body)
	}
	req, _ := http.NewRequest(http.MethodGet, e.url+"/ui/jobs/j1", nil)
	req.Header.Set(ui.HeaderLive, "1")
	poll := c.do(req)
	if poll.code != http.StatusOK {
		t.Fatalf("live poll: %d %s", poll.code, poll.body)
	}
	if strings.Contains(poll.body, words) || strings.Contains(poll.body, `<pre class="log"`) {
		t.Errorf("a live poll's answer carries the logs:\n%s", poll.body)
	}
	for _, want := range []string{`id="job-state"`, "build-07", `data-key="2-running" data-partial`} {
		if !strings.Contains(poll.body, want) {
			t.Errorf("live poll lacks %q:\n%s", want, poll.body)
		}
	}
}
