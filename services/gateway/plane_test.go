package gateway_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/kit/trackertest"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

const (
	planeItem   = "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"
	planeWS     = "acme"
	planeAPIKey = "plane_api_0123456789abcdef"
	// mentionedMember is the user the editor-mention fixture mentions.
	mentionedMember = "9b1e6f2a-7c3d-4e5f-8a9b-0c1d2e3f4a5b"
)

// postPlane sends body as a signed Plane delivery of event and returns
// the answer.
func (g *gw) postPlane(t *testing.T, event string, body []byte) (int, answer) {
	t.Helper()
	h := map[string]string{
		"Content-Type": "application/json", webhook.PlaneEventHeader: event,
		webhook.PlaneSignature: webhook.Sign(planeSecret, body), webhook.PlaneDelivery: fmt.Sprint(time.Now().UnixNano()),
	}
	code, out := g.do(t, http.MethodPost, "/webhooks/plane", h, body)
	var a answer
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatalf("answer %d is not JSON: %q", code, out)
	}
	return code, a
}

// jobTask reads a job's task through the API.
func (g *gw) jobTask(t *testing.T, id string) (task, planeItem string) {
	t.Helper()
	g.jobState(t, id)
	_, out := g.read(t, "/jobs/"+id)
	var j struct {
		Job struct {
			Task struct {
				ID        string `json:"id"`
				PlaneItem string `json:"plane_item"`
			} `json:"task"`
		} `json:"job"`
	}
	if err := json.Unmarshal(out, &j); err != nil {
		t.Fatal(err)
	}
	return j.Job.Task.ID, j.Job.Task.PlaneItem
}

// A mention picked in Plane's editor, sent as Plane sends it (the
// fixture, signed by Plane's secret), queues respond when it names the
// project's plane_agent_member, and is ignored when it names someone
// else.
func TestPlaneEditorMentionQueuesRespond(t *testing.T) {
	t.Parallel()
	body, h := readFixture(t, "plane/issue_comment__created_mention")
	for _, tt := range []struct {
		name, member string
		want         int
	}{
		{"the agent member", mentionedMember, http.StatusAccepted},
		{"someone else", "0e0e0e0e-0000-4000-8000-000000000001", http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, g := newGateway(t, func(e *env) { e.writeRegistry(registryYAML + "    plane_agent_member: " + tt.member + "\n") })
			code, out := g.do(t, http.MethodPost, "/webhooks/plane", h, body)
			if code != tt.want {
				t.Fatalf("answered %d %s, want %d", code, out, tt.want)
			}
			var a answer
			_ = json.Unmarshal(out, &a)
			if tt.want == http.StatusAccepted && (len(a.Jobs) != 1 || a.Jobs[0].Kind != "respond" || a.Jobs[0].Task != planeItem) {
				t.Errorf("answer %s, want one respond job of the item", out)
			}
			if tt.want == http.StatusOK && !strings.Contains(a.Ignored, "does not mention") {
				t.Errorf("answer %s, want ignored: does not mention", out)
			}
		})
	}
}

// planeEnv runs a gateway that reads item names from plane.
func planeEnv(t *testing.T, planeURL string) *gw {
	t.Helper()
	_, g := newGateway(t, func(e *env) {
		e.writeRegistry(registryYAML + "    plane_workspace: " + planeWS + "\n")
		e.tune = func(c *gateway.Config) { c.PlaneURL, c.PlaneToken = planeURL, planeAPIKey }
	})
	return g
}

// Plane's webhooks carry no identifier: the gateway reads the project's
// identifier (once per project) and the item's sequence id through
// Plane's API and names the task wid-41, keeping the item's id in the
// job; a comment on the item, which carries only the item's id, and a
// cancel name the same task.
func TestPlaneItemNamedByIdentifier(t *testing.T) {
	t.Parallel()
	plane := trackertest.NewPlane(t, planeAPIKey)
	plane.SetIdentifier(planeWS, planeProject, "WID")
	plane.AddItemSeq(planeWS, planeProject, planeItem, 41)
	g := planeEnv(t, plane.URL)

	raw, _ := readFixture(t, "plane/issue__updated_labels")
	code, a := g.postPlane(t, "issue", raw)
	if code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].Task != "wid-41" {
		t.Fatalf("label answered %d %+v, want a job of task wid-41", code, a)
	}
	if task, item := g.jobTask(t, a.Jobs[0].ID); task != "wid-41" || item != planeItem {
		t.Errorf("job's task %q, plane_item %q; want wid-41 and the item's id", task, item)
	}
	comment, _ := readFixture(t, "plane/issue_comment__created")
	if code, a := g.postPlane(t, "issue_comment", comment); code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].Task != "wid-41" {
		t.Errorf("comment answered %d %+v, want a respond job of task wid-41", code, a)
	}
	cancel := testkit.EditJSON(t, raw, func(m map[string]any) {
		m["data"].(map[string]any)["state"] = map[string]any{"id": "s9", "name": "Cancelled", "group": "cancelled"}
		m["activity"].(map[string]any)["field"] = "state_id"
	})
	if code, a := g.postPlane(t, "issue", cancel); code != http.StatusAccepted || a.Cancel == nil || a.Cancel.Task != "wid-41" {
		t.Errorf("cancel answered %d %+v, want task wid-41 cancelled", code, a)
	}
	gets := map[string]int{}
	for _, r := range plane.Requests() {
		if r.Auth != planeAPIKey {
			t.Errorf("%s %s with credential %q, want the API key as X-Api-Key", r.Method, r.Path, r.Auth)
		}
		gets[r.Route]++
	}
	if n := gets["/api/v1/workspaces/{slug}/projects/{project}/"]; n != 1 {
		t.Errorf("project read %d times, want once (cached per project)", n)
	}
}

// Without Plane's API (unreachable, or set up but failing) the task keeps
// the item's id; once so named, the item stays that task when the API
// answers again: one work item is never two tasks.
func TestPlaneItemKeepsIDWithoutAPI(t *testing.T) {
	t.Parallel()
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close() // nothing listens there now
		g := planeEnv(t, url)
		comment, _ := readFixture(t, "plane/issue_comment__created")
		start := time.Now()
		code, a := g.postPlane(t, "issue_comment", comment)
		if code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].Task != planeItem {
			t.Errorf("comment answered %d %+v, want a job of task %s", code, a, planeItem)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the answer took %s", took)
		}
	})
	t.Run("failing, then back", func(t *testing.T) {
		t.Parallel()
		plane := trackertest.NewPlane(t, planeAPIKey)
		plane.SetIdentifier(planeWS, planeProject, "WID")
		plane.AddItemSeq(planeWS, planeProject, planeItem, 41)
		plane.SetFault(func(*http.Request, string, int) *trackertest.Fault {
			return &trackertest.Fault{Code: http.StatusBadGateway}
		})
		g := planeEnv(t, plane.URL)
		comment, _ := readFixture(t, "plane/issue_comment__created")
		code, a := g.postPlane(t, "issue_comment", comment)
		if code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].Task != planeItem {
			t.Fatalf("comment answered %d %+v, want a job of task %s", code, a, planeItem)
		}
		g.jobState(t, a.Jobs[0].ID) // the index holds the job now
		plane.SetFault(nil)
		raw, _ := readFixture(t, "plane/issue__updated_labels")
		if code, a := g.postPlane(t, "issue", raw); code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].Task != planeItem {
			t.Errorf("label answered %d %+v, want the item's task %s still", code, a, planeItem)
		}
	})
}

const planeAgentSecret = "plane_app_wh_0123456789abcdef0123456789"

// postPlaneAgent sends body as a signed delivery of the Plane agent app.
func (g *gw) postPlaneAgent(t *testing.T, body []byte) (int, answer) {
	t.Helper()
	h := map[string]string{
		"Content-Type": "application/json", webhook.PlaneEventHeader: "agent_run_user_prompt",
		webhook.PlaneSignature: webhook.Sign(planeAgentSecret, body), webhook.PlaneDelivery: fmt.Sprint(time.Now().UnixNano()),
	}
	code, out := g.do(t, http.MethodPost, "/webhooks/plane-agent", h, body)
	var a answer
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatalf("answer %d is not JSON: %q", code, out)
	}
	return code, a
}

// agentPrompt is a person's prompt on agent run run, shaped as Plane's
// developer documentation shows the agent_run_activity webhook.
func agentPrompt(run, activity, actor, body, signal string) []byte {
	b, _ := json.Marshal(map[string]any{
		"action": "prompted", "type": "agent_run_activity",
		"agent_run_activity": map[string]any{
			"id": activity, "agent_run": run, "type": "prompt", "content": map[string]any{"type": "prompt", "body": body},
			"ephemeral": false, "signal": signal, "actor": actor, "workspace": "d2d97c94-a6ad-4012-b526-5577c0d7c769",
		},
		"agent_run": map[string]any{
			"id": run, "agent_user": mentionedMember, "issue": planeItem, "project": planeProject,
			"workspace": "d2d97c94-a6ad-4012-b526-5577c0d7c769", "status": "in_progress",
		},
		"agent_user_id": mentionedMember, "app_client_id": "orch-app", "comment_id": "c0ffee00-1111-4222-8333-777788889999",
		"issue_id": planeItem, "project_id": planeProject, "workspace_id": "d2d97c94-a6ad-4012-b526-5577c0d7c769",
	})
	return b
}

// A prompt on a Plane agent run (the mention that started it) queues
// respond with the run's id in the job, for a trusted person only; the
// run's stop cancels the job.
func TestPlaneAgentRunQueuesAndStops(t *testing.T) {
	t.Parallel()
	const run, alice = "a9e0run0-0000-4000-8000-000000000001", "6bb20d1c-4960-41ca-af4f-cee01de160c4"
	_, g := newGateway(t, func(e *env) {
		e.writeRegistry(testkit.RegistryYAML("plane_project: "+planeProject, "plane_workspace: "+planeWS, "plane_agent_app: true",
			"plane_agent_member: "+mentionedMember, "trusted_actors: [plane:"+alice+"]"))
		e.tune = func(c *gateway.Config) { c.PlaneAgentSecret = planeAgentSecret }
	})
	if code, a := g.postPlaneAgent(t, agentPrompt(run, "act-0", "0e0e0e0e-0000-4000-8000-00000000bad1", "<p>do it</p>", "continue")); code != http.StatusOK || !strings.Contains(a.Ignored, "not trusted") {
		t.Errorf("an untrusted prompt answered %d %+v, want ignored: not trusted", code, a)
	}
	code, a := g.postPlaneAgent(t, agentPrompt(run, "act-1", alice, "<p>please take this one</p>", "continue"))
	if code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].Kind != "respond" || a.Jobs[0].Task != planeItem {
		t.Fatalf("prompt answered %d %+v, want a respond job of the item", code, a)
	}
	id := a.Jobs[0].ID
	_, out := g.read(t, "/jobs/"+id)
	if !strings.Contains(string(out), `"plane_run":"`+run+`"`) || !strings.Contains(string(out), "please take this one") {
		t.Errorf("job %s, want the run's id and the prompt's words", out)
	}
	code, a = g.postPlaneAgent(t, agentPrompt(run, "act-2", alice, "Stop", "stop"))
	if code != http.StatusAccepted || a.Cancel == nil || a.Cancel.Task != planeItem {
		t.Fatalf("stop answered %d %+v, want the task cancelled", code, a)
	}
	if state := g.jobState(t, id); state != "cancelled" {
		t.Errorf("job %s after the stop, want cancelled", state)
	}
	// A delivery signed with the workspace webhook's secret is not the app's.
	body := agentPrompt(run, "act-3", alice, "again", "continue")
	h := map[string]string{"Content-Type": "application/json", webhook.PlaneSignature: webhook.Sign(planeSecret, body)}
	if code, _ := g.do(t, http.MethodPost, "/webhooks/plane-agent", h, body); code != http.StatusUnauthorized {
		t.Errorf("a delivery signed with ORCH_PLANE_SECRET answered %d, want 401", code)
	}
}
