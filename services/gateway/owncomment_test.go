package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

// orch's own tracking comment quotes the mention that asked for the job;
// over the real webhook path it must queue nothing, whoever posted it, so
// that the agent never loops on its own words.
func TestOwnTrackingCommentQueuesNothing(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	raw, _ := readFixture(t, "gitea/issue_comment__created")
	body := proto.CommentMarker("4b1d9c2e0f3a5b6c7d8e9f01") + "\n### 🔄 orch · respond · running\n\n> @agent-bot please take this one.\n"
	for _, tc := range []struct{ name, login string }{
		{"by agent_user", "agent-bot"},
		{"by a trusted account carrying the marker", "alice"},
	} {
		out := testkit.EditJSON(t, raw, func(m map[string]any) {
			m["comment"].(map[string]any)["body"] = body
			m["comment"].(map[string]any)["user"].(map[string]any)["login"] = tc.login
			m["sender"].(map[string]any)["login"] = tc.login
		})
		code, ans := g.do(t, http.MethodPost, "/webhooks/gitea", giteaHeaders("issue_comment", out), out)
		var a struct {
			Ignored string `json:"ignored"`
		}
		_ = json.Unmarshal(ans, &a)
		if code != http.StatusOK || a.Ignored == "" {
			t.Errorf("%s: webhook answered %d %s, want 200 ignored", tc.name, code, ans)
		}
		if tc.login == "agent-bot" && !strings.Contains(a.Ignored, "agent's own") {
			t.Errorf("%s: ignored for %q, want the agent's own account", tc.name, a.Ignored)
		}
	}
	_, js, _ := natstest.Connect(t, e.srv)
	if n, err := streamMsgs(js); err != nil || n != 0 {
		t.Errorf("JOBS holds %d messages (%v), want 0", n, err)
	}
	if q := g.queue(t); len(q.Recent) != 0 {
		t.Errorf("queue shows %+v, want no job", q.Recent)
	}
}
