package trigger

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

const (
	planeProject = "22b6fc9c-1849-45da-b103-52a3e3a6b4c1"
	planeAgent   = "9b1e0000-0000-4000-8000-00000000a6e7"
	aliceID      = "6bb20d1c-4960-41ca-af4f-cee01de160c4"
	agentLabelID = "b1b2c3d4-0000-4000-8000-000000000010"
)

var now = time.Date(2025, 6, 2, 12, 0, 0, 0, time.UTC)

// The head commits of the pull request in the Gitea fixtures: opened at
// shaA; reopened, reviewed, closed and its workflow run at shaC.
const (
	shaA = "3f2a9c1d7e4b6a5c8d9e0f1a2b3c4d5e6f7a8b9c"
	shaC = "c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3"
)

func testRegistry(t testing.TB) *registry.Registry {
	t.Helper()
	reg, err := registry.Parse([]byte(`projects:
  - key: widgets
    gitea_repo: acme/widgets
    plane_project: ` + planeProject + `
    mention: "@agent-bot"
    agent_user: agent-bot
    plane_agent_member: ` + planeAgent + `
    trusted_actors: [alice, bob, alice@example.com]
`))
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// fixture reads a testdata payload and its headers.
func fixture(t testing.TB, name string) ([]byte, map[string]string) {
	t.Helper()
	return testkit.Fixture(t, filepath.Join("..", "testdata"), name)
}

func obj(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		m = m[p].(map[string]any)
	}
	return m
}

func agentBranch(m map[string]any) { obj(m, "pull_request", "head")["ref"] = "agent/WID-41" }

// want is the expected decision: a job's kind and task, a cancelled task,
// or a substring of the ignored reason.
type want struct {
	kind    proto.Kind
	task    string
	cancel  string
	ignored string
	// head is the job's Task.HeadSHA; "-" for none.
	head string
}

func check(t *testing.T, d Decision, w want) {
	t.Helper()
	if w.ignored != "" {
		if !strings.Contains(d.Ignored, w.ignored) || len(d.Jobs) != 0 || d.Cancel != nil {
			t.Fatalf("decision = %+v, want ignored %q", d, w.ignored)
		}
		return
	}
	if d.Ignored != "" {
		t.Fatalf("ignored: %s; want %+v", d.Ignored, w)
	}
	if w.cancel != "" && (d.Cancel == nil || d.Cancel.Task != w.cancel || d.Cancel.Project != "widgets") {
		t.Fatalf("cancel = %+v, want task %s", d.Cancel, w.cancel)
	}
	if w.cancel == "" && d.Cancel != nil {
		t.Fatalf("unexpected cancel %+v", d.Cancel)
	}
	if w.kind == "" {
		if len(d.Jobs) != 0 {
			t.Fatalf("jobs = %+v, want none", d.Jobs)
		}
		return
	}
	if len(d.Jobs) != 1 {
		t.Fatalf("jobs = %+v, want one", d.Jobs)
	}
	j := d.Jobs[0]
	if j.Kind != w.kind || j.Task.ID != w.task || j.Project != "widgets" {
		t.Errorf("job = %s %s/%s, want %s %s", j.Kind, j.Project, j.Task.ID, w.kind, w.task)
	}
	if w.head != "" && j.Task.HeadSHA != strings.TrimPrefix(w.head, "-") {
		t.Errorf("job's head sha = %q, want %q", j.Task.HeadSHA, strings.TrimPrefix(w.head, "-"))
	}
	if err := j.Validate(); err != nil {
		t.Errorf("job invalid: %v", err)
	}
	// A Plane task names its work item, where the notifier comments.
	if strings.HasPrefix(j.Source.System, "plane") && j.Task.PlaneItem != "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1" {
		t.Errorf("job's plane_item = %q, want the work item's id", j.Task.PlaneItem)
	}
}

// realHead is the head commit of the pull request in the deliveries
// recorded from a real Gitea.
const realHead = "ae9c931c20dd15471e69423e8326033e6202c410"

func TestGitea(t *testing.T) {
	reg := testRegistry(t)
	tests := []struct {
		name    string
		fixture string
		event   string // overrides the fixture's X-Gitea-Event-Type
		edit    func(map[string]any)
		want    want
	}{
		{name: "pr opened", fixture: "pull_request__opened", want: want{kind: proto.KindReview, task: "pr-42", head: shaA}},
		{name: "pr reopened", fixture: "pull_request__reopened", want: want{kind: proto.KindReview, task: "pr-42", head: shaC}},
		{name: "pr synchronized", fixture: "pull_request__opened", event: "pull_request_sync",
			edit: func(m map[string]any) {
				m["action"] = "synchronized"
				obj(m, "pull_request", "head")["sha"] = shaC
			}, want: want{kind: proto.KindReview, task: "pr-42", head: shaC}},
		{name: "pr on agent branch belongs to its task", fixture: "pull_request__opened", edit: agentBranch,
			want: want{kind: proto.KindReview, task: "wid-41", head: shaA}},
		{name: "pr pushed by the agent is reviewed too", fixture: "pull_request__opened", edit: func(m map[string]any) {
			agentBranch(m)
			obj(m, "sender")["login"] = "agent-bot"
		}, want: want{kind: proto.KindReview, task: "wid-41"}},
		{name: "pr closed", fixture: "pull_request__closed", want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "pr merged", fixture: "pull_request__closed_merged", want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "pr deleted", fixture: "pull_request__closed", edit: func(m map[string]any) { m["action"] = "deleted" },
			want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "agent pr closed", fixture: "pull_request__closed", edit: agentBranch,
			want: want{kind: proto.KindCleanup, task: "wid-41", cancel: "wid-41"}},
		{name: "pr edited", fixture: "pull_request__opened", edit: func(m map[string]any) { m["action"] = "edited" },
			want: want{ignored: `action "edited"`}},
		{name: "review requested", fixture: "pull_request_review_request__review_requested", want: want{ignored: "not acted on"}},
		{name: "review rejected on a human branch", fixture: "pull_request_review_rejected__reviewed", want: want{ignored: "not an agent branch"}},
		{name: "review rejected on an agent branch", fixture: "pull_request_review_rejected__reviewed", edit: agentBranch,
			want: want{kind: proto.KindFix, task: "wid-41", head: shaC}},
		{name: "agent's own rejecting review", fixture: "pull_request_review_rejected__reviewed", edit: func(m map[string]any) {
			agentBranch(m)
			obj(m, "sender")["login"] = "agent-bot"
		}, want: want{ignored: "agent's own"}},
		{name: "review approved", fixture: "pull_request_review_approved__reviewed", edit: agentBranch, want: want{ignored: "not acted on"}},
		{name: "review comment", fixture: "pull_request_review_comment__reviewed", edit: agentBranch, want: want{ignored: "not acted on"}},
		{name: "issue comment with mention", fixture: "issue_comment__created", want: want{kind: proto.KindRespond, task: "issue-41", head: "-"}},
		{name: "issue comment edited", fixture: "issue_comment__edited", want: want{ignored: `action "edited"`}},
		{name: "mention from an untrusted actor", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "comment", "user")["login"] = "mallory"
			obj(m, "comment", "user")["email"] = "mallory@example.com"
			obj(m, "sender")["login"] = "mallory"
		}, want: want{ignored: "not trusted"}},
		{name: "the agent's own comment", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "comment", "user")["login"] = "agent-bot"
			obj(m, "sender")["login"] = "agent-bot"
		}, want: want{ignored: "agent's own"}},
		{name: "orch's tracking comment by a trusted account, quoting the mention", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "comment")["body"] = proto.CommentMarker("0123abcd") + "\n### orch · respond · done\n\n> @agent-bot please take this one."
		}, want: want{ignored: "tracking comment"}},
		{name: "comment without mention", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "comment")["body"] = "mail me at x@agent-bot.example or ask @agent-bots"
		}, want: want{ignored: "does not mention"}},
		{name: "pull request comment with mention", fixture: "issue_comment__created", event: "pull_request_comment",
			edit: func(m map[string]any) {
				m["is_pull"] = true
				obj(m, "issue")["pull_request"] = map[string]any{"html_url": "https://gitea.example.com/acme/widgets/pulls/41"}
			}, want: want{kind: proto.KindRespond, task: "pr-41", head: "-"}},
		{name: "pull request comment naming the agent branch", fixture: "issue_comment__created", event: "pull_request_comment",
			edit: func(m map[string]any) {
				m["is_pull"] = true
				m["pull_request"] = map[string]any{"number": 41, "head": map[string]any{"ref": "agent/wid-7", "sha": shaA}}
			}, want: want{kind: proto.KindRespond, task: "wid-7", head: shaA}},
		// Deliveries recorded from Gitea 1.26.0 (deployments/local/realgitea.sh):
		// a push to an agent branch's pull request, and a person's comment
		// on it, which Gitea 1.26 sends with the pull request (head branch
		// and commit) and the author's placeholder e-mail.
		{name: "gitea 1.26: push to an agent's pull request", fixture: "pull_request_sync__synchronized",
			want: want{kind: proto.KindReview, task: "demo", head: realHead}},
		{name: "gitea 1.26: comment on an agent's pull request", fixture: "pull_request_comment__created",
			want: want{kind: proto.KindRespond, task: "demo", head: realHead}},
		{name: "gitea 1.26: orch's tracking comment on it", fixture: "pull_request_comment__created", edit: func(m map[string]any) {
			obj(m, "comment")["body"] = proto.CommentMarker("0123abcd") + "\n### 🔄 orch · respond · running\n\n> @agent-bot please explain the sort order"
			obj(m, "comment", "user")["login"] = "agent-bot"
			obj(m, "sender")["login"] = "agent-bot"
		}, want: want{ignored: "agent's own"}},
		{name: "unknown repository", fixture: "pull_request__opened", edit: func(m map[string]any) {
			obj(m, "repository")["full_name"] = "other/repo"
		}, want: want{ignored: "unknown repository"}},
		{name: "issue opened", fixture: "issues__opened", want: want{ignored: "not acted on"}},
		{name: "issue closed", fixture: "issues__closed", want: want{ignored: "not acted on"}},
		{name: "issue labelled", fixture: "issue_label__label_updated", want: want{ignored: "not acted on"}},
		{name: "issue assigned", fixture: "issue_assign__assigned", want: want{ignored: "not acted on"}},
		{name: "push", fixture: "push__push", want: want{ignored: "not acted on"}},
		{name: "workflow run failed on an agent branch", fixture: "workflow_run", event: "workflow_run",
			want: want{kind: proto.KindFix, task: "wid-41", head: shaC}},
		{name: "workflow run succeeded", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) { obj(m, "workflow_run")["conclusion"] = "success" }, want: want{ignored: "not failure"}},
		{name: "workflow run failed on a human branch", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) { obj(m, "workflow_run")["head_branch"] = "main" }, want: want{ignored: "not an agent branch"}},
		{name: "workflow run in progress", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) { m["action"] = "in_progress" }, want: want{ignored: "not acted on"}},
		{name: "path escape in a branch", fixture: "pull_request__opened", edit: func(m map[string]any) {
			obj(m, "pull_request", "head")["ref"] = "agent/../../etc/passwd"
		}, want: want{kind: proto.KindReview, task: "etc-passwd"}},
		{name: "subject escape in a branch", fixture: "pull_request__opened", edit: func(m map[string]any) {
			obj(m, "pull_request", "head")["ref"] = "agent/a.b.>*"
		}, want: want{kind: proto.KindReview, task: "a-b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, h := fixture(t, "gitea/"+tt.fixture)
			event := h[webhook.GiteaEventType]
			if tt.event != "" {
				event = tt.event
			}
			d, err := Gitea(reg, event, h[webhook.GiteaDelivery], testkit.EditJSON(t, body, tt.edit), now)
			if err != nil {
				t.Fatal(err)
			}
			check(t, d, tt.want)
		})
	}
}

func TestPlane(t *testing.T) {
	reg := testRegistry(t)
	addAgent := func(m map[string]any) {
		obj(m, "data")["assignees"] = []any{planeAgent}
		obj(m, "activity")["field"] = "assignee_ids"
		obj(m, "activity")["old_value"] = []any{}
		obj(m, "activity")["new_value"] = []any{planeAgent}
	}
	stateTo := func(field, group string) func(map[string]any) {
		return func(m map[string]any) {
			obj(m, "data")["state"] = map[string]any{"id": "s1", "name": "Gone", "group": group}
			obj(m, "activity")["field"] = field
			obj(m, "activity")["new_value"] = "s1"
		}
	}
	tests := []struct {
		name    string
		fixture string
		edit    func(map[string]any)
		want    want
	}{
		{name: "created without label or agent", fixture: "issue__created", want: want{ignored: "neither"}},
		{name: "created with the label", fixture: "issue__created", edit: func(m map[string]any) {
			obj(m, "data")["labels"] = []any{map[string]any{"id": agentLabelID, "name": "agent"}}
		}, want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "created assigned to the agent", fixture: "issue__created", edit: func(m map[string]any) {
			obj(m, "data")["assignees"] = []any{map[string]any{"id": planeAgent}}
		}, want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "label added (web app label_ids)", fixture: "issue__updated_labels",
			want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "label added with project identifier", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "data")["project_detail"] = map[string]any{"identifier": "WID"}
		}, want: want{kind: proto.KindImplement, task: "wid-41"}},
		{name: "label added (API labels, by name)", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["field"] = "labels"
			obj(m, "activity")["old_value"] = nil
			obj(m, "activity")["new_value"] = "agent"
		}, want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "other label added while the label was there", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["old_value"] = []any{agentLabelID}
		}, want: want{ignored: "does not newly add"}},
		{name: "API: other label added", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["field"] = "labels"
			obj(m, "activity")["old_value"] = ""
			obj(m, "activity")["new_value"] = "bug"
		}, want: want{ignored: "does not newly add"}},
		{name: "label removed", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "data")["labels"] = []any{}
			obj(m, "activity")["old_value"] = []any{agentLabelID}
			obj(m, "activity")["new_value"] = []any{}
		}, want: want{ignored: "does not newly add"}},
		{name: "label added by an untrusted actor", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "u-mallory", "email": "mallory@example.com"}
		}, want: want{ignored: "not trusted"}},
		{name: "agent assigned (web app assignee_ids)", fixture: "issue__updated_labels", edit: addAgent,
			want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "agent assigned (API assignees)", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			addAgent(m)
			obj(m, "activity")["field"] = "assignees"
			obj(m, "activity")["old_value"] = nil
			obj(m, "activity")["new_value"] = planeAgent
		}, want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "agent assigned by an actor not in trusted_actors", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			addAgent(m)
			obj(m, "activity")["actor"] = map[string]any{"id": "u-carol", "email": "carol@example.com"}
		}, want: want{kind: proto.KindImplement, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "someone else assigned while the agent was", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			addAgent(m)
			obj(m, "activity")["old_value"] = []any{planeAgent}
			obj(m, "activity")["new_value"] = []any{planeAgent, "u-bob"}
		}, want: want{ignored: "does not newly assign"}},
		{name: "moved to a cancelled state (state_id)", fixture: "issue__updated_labels", edit: stateTo("state_id", "cancelled"),
			want: want{cancel: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "moved to a cancelled state (state)", fixture: "issue__updated_labels", edit: stateTo("state", "cancelled"),
			want: want{cancel: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "moved to a started state", fixture: "issue__updated_labels", edit: stateTo("state_id", "started"),
			want: want{ignored: `group "started"`}},
		{name: "other field updated", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["field"] = "priority"
		}, want: want{ignored: `field "priority"`}},
		{name: "comment with mention", fixture: "issue_comment__created",
			want: want{kind: proto.KindRespond, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "comment updated", fixture: "issue_comment__updated", want: want{ignored: `action "updated"`}},
		{name: "comment mention from an untrusted actor", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "u-mallory", "email": "mallory@example.com"}
		}, want: want{ignored: "not trusted"}},
		{name: "the agent's own comment", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": planeAgent}
			obj(m, "data")["actor"] = planeAgent
		}, want: want{ignored: "agent's own"}},
		{name: "orch's tracking comment, quoting the mention", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "data")["external_source"] = proto.PlaneExternalSource
			obj(m, "data")["external_id"] = "0123abcd"
		}, want: want{ignored: "tracking comment"}},
		{name: "comment without mention", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "data")["comment_html"] = "<p>no one here</p>"
		}, want: want{ignored: "does not mention"}},
		{name: "unknown project", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "data")["project"] = "00000000-0000-0000-0000-000000000000"
		}, want: want{ignored: "unknown plane project"}},
		{name: "project deleted", fixture: "project__deleted", want: want{ignored: "not acted on"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, h := fixture(t, "plane/"+tt.fixture)
			d, err := Plane(reg, h[webhook.PlaneEventHeader], h[webhook.PlaneDelivery], testkit.EditJSON(t, body, tt.edit), now)
			if err != nil {
				t.Fatal(err)
			}
			check(t, d, tt.want)
		})
	}
}

// Every fixture is covered by a row above.
func TestEveryFixtureHasARow(t *testing.T) {
	src, err := os.ReadFile("trigger_test.go")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../testdata/*/*.json")
	for _, f := range files {
		if strings.HasSuffix(f, ".headers.json") {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		if !strings.Contains(string(src), `fixture: "`+name+`"`) {
			t.Errorf("fixture %s has no row in the trigger table", f)
		}
	}
}

// The same event twice names the same job; a delivery id does not matter,
// and a different head names another.
func TestJobIDFollowsContent(t *testing.T) {
	reg := testRegistry(t)
	body, _ := fixture(t, "gitea/pull_request__opened")
	a, _ := Gitea(reg, "pull_request", "delivery-1", body, now)
	b, _ := Gitea(reg, "pull_request", "delivery-2", body, now.Add(time.Hour))
	c, _ := Gitea(reg, "pull_request", "delivery-1", testkit.EditJSON(t, body, func(m map[string]any) {
		obj(m, "pull_request", "head")["sha"] = "ffff"
	}), now)
	if a.Jobs[0].ID != b.Jobs[0].ID {
		t.Errorf("same content, different ids %s %s", a.Jobs[0].ID, b.Jobs[0].ID)
	}
	if a.Jobs[0].ID == c.Jobs[0].ID {
		t.Error("a new head sha named the same job")
	}
}

func TestMentions(t *testing.T) {
	tests := []struct {
		text string
		want bool
	}{
		{"@agent please", true},
		{"hey @agent.", true},
		{"(@agent)", true},
		{"@agent", true},
		{"@agent-bot please", false},
		{"@agents", false},
		{"me@agent.example", false},
		{"@agent.bot", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := Mentions(tt.text, "@agent"); got != tt.want {
			t.Errorf("Mentions(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}
