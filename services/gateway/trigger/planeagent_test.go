package trigger

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
)

func agentRegistry(t *testing.T, app bool) *registry.Registry {
	t.Helper()
	reg, err := registry.Parse([]byte(`projects:
  - key: widgets
    plane_project: ` + planeProject + `
    plane_workspace: acme
    plane_agent_app: ` + map[bool]string{true: "true", false: "false"}[app] + `
    plane_agent_member: ` + planeAgent + `
    trusted_actors: [plane:` + aliceID + `]
`))
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func agentBody(t *testing.T, typ, action string, edit func(m map[string]any)) []byte {
	t.Helper()
	m := map[string]any{
		"type": typ, "action": action,
		"agent_run": map[string]any{"id": "run-1", "issue": "item-1", "project": planeProject, "creator": aliceID, "status": "created"},
		"issue_id":  "item-1", "project_id": planeProject,
		"agent_run_activity": map[string]any{"id": "act-1", "agent_run": "run-1", "type": "prompt",
			"content": map[string]any{"type": "prompt", "body": "<p>go</p>"}, "signal": "continue", "actor": aliceID},
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A Plane agent app's deliveries: a prompt queues respond for a trusted
// person, its stop cancels the task, a run created by an assignment (no
// comment) queues implement, one created from a comment waits for its
// prompt; nothing for a project without plane_agent_app.
func TestPlaneAgent(t *testing.T) {
	tests := []struct {
		name     string
		app      bool
		typ, act string
		edit     func(map[string]any)
		kind     proto.Kind
		cancel   bool
		ignored  string
	}{
		{name: "prompt", app: true, typ: "agent_run_activity", act: "prompted", kind: proto.KindRespond},
		{name: "prompt by someone untrusted", app: true, typ: "agent_run_activity", act: "prompted", edit: func(m map[string]any) {
			m["agent_run_activity"].(map[string]any)["actor"] = "u-mallory"
		}, ignored: "not trusted"},
		{name: "stop", app: true, typ: "agent_run_activity", act: "prompted", edit: func(m map[string]any) {
			m["agent_run_activity"].(map[string]any)["signal"] = "stop"
		}, cancel: true},
		{name: "run from an assignment", app: true, typ: "agent_run", act: "created", kind: proto.KindImplement},
		{name: "run from a comment", app: true, typ: "agent_run", act: "created", edit: func(m map[string]any) {
			m["comment_id"] = "c-1"
		}, ignored: "its prompt queues the job"},
		{name: "project without plane_agent_app", typ: "agent_run_activity", act: "prompted", ignored: "no plane_agent_app"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := PlaneAgent(agentRegistry(t, tt.app), "d", agentBody(t, tt.typ, tt.act, tt.edit), now, "WID-41")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.ignored != "":
				if !strings.Contains(d.Ignored, tt.ignored) {
					t.Errorf("decision %+v, want ignored %q", d, tt.ignored)
				}
			case tt.cancel:
				if d.Cancel == nil || d.Cancel.Task != "wid-41" {
					t.Errorf("decision %+v, want task wid-41 cancelled", d)
				}
			default:
				if len(d.Jobs) != 1 || d.Jobs[0].Kind != tt.kind || d.Jobs[0].Task.PlaneRun != "run-1" || d.Jobs[0].Task.PlaneItem != "item-1" || d.Jobs[0].Task.ID != "wid-41" {
					t.Errorf("decision %+v, want one %s job of run-1", d, tt.kind)
				}
			}
		})
	}
	if _, err := PlaneAgent(agentRegistry(t, true), "d", []byte(`{"type":"agent_run"}`), now, ""); err == nil {
		t.Error("a run without its id parsed")
	}
}
