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

// forkAgentBranch makes the pull request come from mallory's fork, on a
// branch named like orch's task.
func forkAgentBranch(m map[string]any) {
	agentBranch(m)
	head := obj(m, "pull_request", "head")
	head["repo_id"] = 99
	head["repo"] = map[string]any{"id": 99, "name": "widgets", "full_name": "mallory/widgets", "fork": true}
}

// noHeadRepo leaves out what says where the head branch is, as older
// payloads do.
func noHeadRepo(m map[string]any) {
	head := obj(m, "pull_request", "head")
	delete(head, "repo_id")
	delete(head, "repo")
}

// by makes the delivery's sender login.
func by(login string) func(map[string]any) {
	return func(m map[string]any) { obj(m, "sender")["login"] = login }
}

// all applies edits in order.
func all(edits ...func(map[string]any)) func(map[string]any) {
	return func(m map[string]any) {
		for _, e := range edits {
			e(m)
		}
	}
}

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
		// A fork's branch is a person's, whatever it is called.
		{name: "fork's pr on a branch named agent/<task> opened", fixture: "pull_request__opened", edit: forkAgentBranch,
			want: want{kind: proto.KindReview, task: "pr-42", head: shaA}},
		{name: "fork's pr on a branch named agent/<task> synchronized", fixture: "pull_request__opened", event: "pull_request_sync",
			edit: all(forkAgentBranch, func(m map[string]any) { m["action"] = "synchronized" }),
			want: want{kind: proto.KindReview, task: "pr-42"}},
		{name: "fork's pr on a branch named agent/<task> closed", fixture: "pull_request__closed", edit: forkAgentBranch,
			want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "fork's pr whose fork was deleted (head repo null) closed", fixture: "pull_request__closed", edit: all(forkAgentBranch, func(m map[string]any) {
			obj(m, "pull_request", "head")["repo"] = nil
		}), want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "head repo_id agrees but its name is another", fixture: "pull_request__closed", edit: all(agentBranch, func(m map[string]any) {
			obj(m, "pull_request", "head", "repo")["full_name"] = "mallory/widgets"
		}), want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "pr on agent/<task> without head repository (older payload) is taken for a fork's", fixture: "pull_request__closed",
			edit: all(agentBranch, noHeadRepo), want: want{kind: proto.KindCleanup, task: "pr-42", cancel: "pr-42"}},
		{name: "agent pr told only by the head repository's name, in another case", fixture: "pull_request__closed", edit: all(agentBranch, func(m map[string]any) {
			delete(obj(m, "pull_request", "head"), "repo_id")
			obj(m, "pull_request", "head", "repo")["full_name"] = "ACME/Widgets"
		}), want: want{kind: proto.KindCleanup, task: "wid-41", cancel: "wid-41"}},
		{name: "pr edited", fixture: "pull_request__opened", edit: func(m map[string]any) { m["action"] = "edited" },
			want: want{ignored: `action "edited"`}},
		{name: "review requested", fixture: "pull_request_review_request__review_requested", want: want{ignored: "not acted on"}},
		{name: "review rejected on a human branch", fixture: "pull_request_review_rejected__reviewed", want: want{ignored: "not an agent branch"}},
		{name: "review rejected on an agent branch", fixture: "pull_request_review_rejected__reviewed", edit: agentBranch,
			want: want{kind: proto.KindFix, task: "wid-41", head: shaC}},
		{name: "review rejected by an untrusted reviewer", fixture: "pull_request_review_rejected__reviewed", edit: all(agentBranch, by("mallory")),
			want: want{ignored: `actor "mallory" is not trusted`}},
		{name: "review rejected by a trusted reviewer, login in another case", fixture: "pull_request_review_rejected__reviewed", edit: all(agentBranch, by("Bob")),
			want: want{kind: proto.KindFix, task: "wid-41"}},
		{name: "review rejected on a fork's branch named agent/<task>", fixture: "pull_request_review_rejected__reviewed", edit: forkAgentBranch,
			want: want{ignored: `"mallory/widgets:agent/WID-41", not an agent branch`}},
		{name: "review rejected on agent/<task> without head repository", fixture: "pull_request_review_rejected__reviewed", edit: all(agentBranch, noHeadRepo),
			want: want{ignored: "not an agent branch"}},
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
		}, want: want{ignored: `actor "mallory" is not trusted`}},
		// Gitea does not confirm e-mails by default: a Gitea account is
		// trusted by its login only.
		{name: "mention from an untrusted login with a trusted e-mail", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "comment", "user")["login"] = "mallory"
			obj(m, "comment", "user")["email"] = "alice@example.com"
			obj(m, "sender")["login"] = "mallory"
		}, want: want{ignored: `actor "mallory" is not trusted`}},
		{name: "mention from a trusted login in another case", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "comment", "user")["login"] = "ALICE"
		}, want: want{kind: proto.KindRespond, task: "issue-41"}},
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
				m["pull_request"] = map[string]any{"number": 41, "head": map[string]any{"ref": "agent/wid-7", "sha": shaA, "repo_id": 12},
					"base": map[string]any{"ref": "main", "repo_id": 12}}
			}, want: want{kind: proto.KindRespond, task: "wid-7", head: shaA}},
		{name: "pull request comment naming a fork's branch agent/<task>", fixture: "issue_comment__created", event: "pull_request_comment",
			edit: func(m map[string]any) {
				m["is_pull"] = true
				m["pull_request"] = map[string]any{"number": 41, "head": map[string]any{"ref": "agent/wid-7", "sha": shaA, "repo_id": 99},
					"base": map[string]any{"ref": "main", "repo_id": 12}}
			}, want: want{kind: proto.KindRespond, task: "pr-41", head: shaA}},
		{name: "pull request comment naming agent/<task> without head repository", fixture: "issue_comment__created", event: "pull_request_comment",
			edit: func(m map[string]any) {
				m["is_pull"] = true
				m["pull_request"] = map[string]any{"number": 41, "head": map[string]any{"ref": "agent/wid-7", "sha": shaA}}
			}, want: want{kind: proto.KindRespond, task: "pr-41", head: shaA}},
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
		// Gitea's workflow_run names no head repository; a run for a pull
		// request event may be a fork's, and is never an agent branch's.
		{name: "workflow run failed for a pull request event", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) { obj(m, "workflow_run")["event"] = "pull_request" }, want: want{ignored: "not a push to an agent branch"}},
		{name: "workflow run failed for a pull_request_target event", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) { obj(m, "workflow_run")["event"] = "pull_request_target" }, want: want{ignored: "not a push to an agent branch"}},
		{name: "workflow run failed on a fork's head (a sender naming head_repository)", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) {
				obj(m, "workflow_run")["head_repository"] = map[string]any{"full_name": "mallory/widgets"}
			},
			want: want{ignored: "a fork"}},
		{name: "workflow run failed on an agent branch, head_repository the repository", fixture: "workflow_run", event: "workflow_run",
			edit: func(m map[string]any) {
				obj(m, "workflow_run")["head_repository"] = map[string]any{"full_name": "acme/widgets"}
			},
			want: want{kind: proto.KindFix, task: "wid-41"}},
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
		// Assigning the agent hands the item's words to it, as a label
		// does: the member who assigns must be trusted.
		{name: "agent assigned by an actor not in trusted_actors", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			addAgent(m)
			obj(m, "activity")["actor"] = map[string]any{"id": "u-carol", "email": "carol@example.com"}
		}, want: want{ignored: `actor "carol@example.com" is not trusted`}},
		{name: "created assigned to the agent by an actor not in trusted_actors", fixture: "issue__created", edit: func(m map[string]any) {
			obj(m, "data")["assignees"] = []any{map[string]any{"id": planeAgent}}
			obj(m, "activity")["actor"] = map[string]any{"id": "u-carol", "email": "carol@example.com"}
		}, want: want{ignored: `actor "carol@example.com" is not trusted`}},
		{name: "label added by a member whose display name is trusted", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "u-mallory", "email": "mallory@example.com", "display_name": "alice"}
		}, want: want{ignored: `actor "mallory@example.com" is not trusted`}},
		{name: "label added by a member named only by a trusted display name", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "bob", "display_name": "bob"}
			obj(m, "data")["updated_by"] = "bob"
		}, want: want{ignored: `actor "bob" is not trusted`}},
		{name: "label added by alice, trusted by her e-mail", fixture: "issue__updated_labels", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "u-alice", "email": "Alice@Example.com", "display_name": "someone"}
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
		// Plane's editor writes a mention picked from its list as a
		// mention-component naming the member's user id, with no @name.
		{name: "editor mention of the agent member", fixture: "issue_comment__created_mention", edit: mentionOf(planeAgent),
			want: want{kind: proto.KindRespond, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"}},
		{name: "editor mention of someone else", fixture: "issue_comment__created_mention", want: want{ignored: "does not mention"}},
		{name: "editor mention of the agent member by an untrusted actor", fixture: "issue_comment__created_mention", edit: func(m map[string]any) {
			mentionOf(planeAgent)(m)
			obj(m, "activity")["actor"] = map[string]any{"id": "u-mallory", "email": "mallory@example.com"}
		}, want: want{ignored: `actor "mallory@example.com" is not trusted`}},
		{name: "editor mention of the agent member as an issue mention", fixture: "issue_comment__created_mention", edit: func(m map[string]any) {
			obj(m, "data")["comment_html"] = `<p><mention-component entity_identifier="` + planeAgent + `" entity_name="issue_mention"></mention-component></p>`
		}, want: want{ignored: "does not mention"}},

		{name: "comment mention from an untrusted actor", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "u-mallory", "email": "mallory@example.com"}
		}, want: want{ignored: "not trusted"}},
		{name: "comment mention from a member whose display name is trusted", fixture: "issue_comment__created", edit: func(m map[string]any) {
			obj(m, "activity")["actor"] = map[string]any{"id": "u-mallory", "email": "mallory@example.com", "display_name": "alice"}
		}, want: want{ignored: `actor "mallory@example.com" is not trusted`}},
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

// mentionOf makes the editor-mention fixture's comment mention member.
func mentionOf(member string) func(map[string]any) {
	return func(m map[string]any) {
		c := obj(m, "data")
		c["comment_html"] = strings.ReplaceAll(c["comment_html"].(string), "9b1e6f2a-7c3d-4e5f-8a9b-0c1d2e3f4a5b", member)
	}
}

// The editor-mention fixture as Plane sends it queues respond for the
// project whose agent member it names, with the same job a typed mention
// queues; spelled in any of the ways HTML allows, with other mentions
// beside it.
func TestPlaneEditorMention(t *testing.T) {
	const mentioned = "9b1e6f2a-7c3d-4e5f-8a9b-0c1d2e3f4a5b"
	reg, err := registry.Parse([]byte(`projects:
  - key: widgets
    gitea_repo: acme/widgets
    plane_project: ` + planeProject + `
    mention: "@agent-bot"
    plane_agent_member: ` + mentioned + `
    trusted_actors: [alice@example.com]
`))
	if err != nil {
		t.Fatal(err)
	}
	body, h := fixture(t, "plane/issue_comment__created_mention")
	d, err := Plane(reg, h[webhook.PlaneEventHeader], h[webhook.PlaneDelivery], body, now)
	if err != nil {
		t.Fatal(err)
	}
	check(t, d, want{kind: proto.KindRespond, task: "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"})
	if got := d.Jobs[0].Trigger; !strings.Contains(got, "please take this one") {
		t.Errorf("trigger text = %q, want the comment's words", got)
	}
	typed, err := Plane(reg, h[webhook.PlaneEventHeader], h[webhook.PlaneDelivery], testkit.EditJSON(t, body, func(m map[string]any) {
		obj(m, "data")["comment_html"] = "<p>@agent-bot please take this one</p>"
	}), now)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := d.Jobs[0], typed.Jobs[0]; a.ID != b.ID || a.Kind != b.Kind || a.Task != b.Task || a.Source != b.Source {
		t.Errorf("editor mention job %+v differs from the typed mention's %+v", a, b)
	}

	for _, html := range []string{
		`<mention-component entity_name="user_mention" entity_identifier="` + mentioned + `"></mention-component>`,
		`<MENTION-COMPONENT ENTITY_IDENTIFIER='` + mentioned + `' Entity_Name='USER_MENTION'/>`,
		`<mention-component id="m1" entity_identifier=` + mentioned + ` entity_name=user_mention>`,
		`<p><mention-component entity_identifier="u-bob" entity_name="user_mention"></mention-component> and ` +
			`<mention-component entity_identifier="x" entity_name="issue_mention"></mention-component> and ` +
			`<mention-component data-x="a>b" entity_identifier="` + mentioned + `" entity_name="user_mention"></mention-component></p>`,
	} {
		d, err := Plane(reg, "issue_comment", "d", testkit.EditJSON(t, body, func(m map[string]any) {
			obj(m, "data")["comment_html"] = html
		}), now)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Jobs) != 1 || d.Jobs[0].Kind != proto.KindRespond {
			t.Errorf("%s: decision %+v, want respond", html, d)
		}
	}
	for _, html := range []string{
		`<mention-componentx entity_identifier="` + mentioned + `" entity_name="user_mention">`,
		`<p>entity_identifier="` + mentioned + `" entity_name="user_mention"</p>`,
		`<mention-component entity_identifier="` + mentioned + `x" entity_name="user_mention"></mention-component>`,
		`<mention-component entity_identifier="` + mentioned + `"></mention-component>`,
	} {
		d, err := Plane(reg, "issue_comment", "d", testkit.EditJSON(t, body, func(m map[string]any) {
			obj(m, "data")["comment_html"] = html
		}), now)
		if err != nil {
			t.Fatal(err)
		}
		if d.Ignored == "" {
			t.Errorf("%s: decision %+v, want ignored", html, d)
		}
	}
}

// A name handed in (from Plane's API) names the task of every event
// about the item, the item's id staying in the job.
func TestPlaneNamed(t *testing.T) {
	reg := testRegistry(t)
	for _, f := range []string{"plane/issue__updated_labels", "plane/issue_comment__created"} {
		body, h := fixture(t, f)
		d, err := PlaneNamed(reg, h[webhook.PlaneEventHeader], "d", body, now, "WID-41")
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Jobs) != 1 || d.Jobs[0].Task.ID != "wid-41" || d.Jobs[0].Task.PlaneItem != "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1" {
			t.Errorf("%s: jobs %+v, want task wid-41 of the item", f, d.Jobs)
		}
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

// Typed trusted_actors entries are trusted each in its own system only;
// an untyped e-mail is a Plane member's.
func TestTypedTrustedActors(t *testing.T) {
	const memberID = "0d5c8e3a-1f2b-4c6d-9e8f-7a6b5c4d3e2f"
	reg, err := registry.Parse([]byte(`projects:
  - key: widgets
    gitea_repo: acme/widgets
    plane_project: ` + planeProject + `
    mention: "@agent-bot"
    trusted_actors: ["gitea:bob", "plane:` + memberID + `", "plane:bob@example.com", carol@example.com]
`))
	if err != nil {
		t.Fatal(err)
	}
	comment := func(login, email string) func(map[string]any) {
		return func(m map[string]any) {
			obj(m, "comment", "user")["login"], obj(m, "comment", "user")["email"] = login, email
			obj(m, "sender")["login"] = login
		}
	}
	label := func(actor map[string]any) func(map[string]any) {
		return func(m map[string]any) {
			obj(m, "activity")["actor"] = actor
			obj(m, "data")["updated_by"] = actor["id"]
		}
	}
	const item = "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"
	tests := []struct {
		name, fixture string
		edit          func(map[string]any)
		want          want
	}{
		{"gitea:bob in Gitea", "gitea/issue_comment__created", comment("bob", ""), want{kind: proto.KindRespond, task: "issue-41"}},
		{"gitea:bob is not a Plane member named bob", "plane/issue__updated_labels", label(map[string]any{"id": "bob", "display_name": "bob"}),
			want{ignored: `actor "bob" is not trusted`}},
		{"plane:<member id> in Plane", "plane/issue__updated_labels", label(map[string]any{"id": memberID, "email": "x@example.com"}),
			want{kind: proto.KindImplement, task: item}},
		{"plane:<member id> is not a Gitea login", "gitea/issue_comment__created", comment(memberID, ""),
			want{ignored: "is not trusted"}},
		{"plane:<email> in Plane", "plane/issue__updated_labels", label(map[string]any{"id": "u-9", "email": "bob@example.com"}),
			want{kind: proto.KindImplement, task: item}},
		{"plane:<email> is not a Gitea account's e-mail", "gitea/issue_comment__created", comment("mallory", "bob@example.com"),
			want{ignored: `actor "mallory" is not trusted`}},
		{"an untyped e-mail in Plane, by e-mail", "plane/issue__updated_labels", label(map[string]any{"id": "u-7", "email": "carol@example.com"}),
			want{kind: proto.KindImplement, task: item}},
		{"an untyped e-mail is not a Gitea account's e-mail", "gitea/issue_comment__created", comment("mallory", "carol@example.com"),
			want{ignored: `actor "mallory" is not trusted`}},
		{"untyped alice is not there", "gitea/issue_comment__created", comment("alice", "alice@example.com"),
			want{ignored: `actor "alice" is not trusted`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, h := fixture(t, tt.fixture)
			body = testkit.EditJSON(t, body, tt.edit)
			var d Decision
			if strings.HasPrefix(tt.fixture, "gitea/") {
				d, err = Gitea(reg, h[webhook.GiteaEventType], "d", body, now)
			} else {
				d, err = Plane(reg, h[webhook.PlaneEventHeader], "d", body, now)
			}
			if err != nil {
				t.Fatal(err)
			}
			check(t, d, tt.want)
		})
	}
}

// A job records whose words it carries and whether the project trusts
// them: a stranger's pull request is reviewed, its words marked as a
// stranger's.
func TestJobsRecordWhoseWordsTheyAre(t *testing.T) {
	reg := testRegistry(t)
	decide := func(fixtureName string, edit func(map[string]any)) proto.Job {
		t.Helper()
		body, h := fixture(t, "gitea/"+fixtureName)
		d, err := Gitea(reg, h[webhook.GiteaEventType], "d", testkit.EditJSON(t, body, edit), now)
		if err != nil || len(d.Jobs) != 1 {
			t.Fatalf("%s: %+v, %v; want one job", fixtureName, d, err)
		}
		return d.Jobs[0]
	}
	stranger := decide("pull_request__opened", all(forkAgentBranch, by("mallory"), func(m map[string]any) {
		obj(m, "pull_request", "user")["login"] = "mallory"
	}))
	if s, tk := stranger.Source, stranger.Task; s.Actor != "mallory" || s.Trusted || tk.Author != "mallory" || tk.AuthorTrusted {
		t.Errorf("mallory's pull request: source %+v, author %q trusted %v; want mallory, untrusted", s, tk.Author, tk.AuthorTrusted)
	}
	if !stranger.Task.FromFork {
		t.Errorf("the fork's pull request: task %+v, want from_fork", stranger.Task)
	}
	fix := decide("pull_request_review_rejected__reviewed", agentBranch)
	if fix.Task.FromFork {
		t.Errorf("orch's pull request: task %+v, want not from_fork", fix.Task)
	}
	if j := decide("pull_request__opened", all(agentBranch, noHeadRepo)); !j.Task.FromFork || j.Task.ID != "pr-42" {
		t.Errorf("a pull request the payload does not place: task %+v, want pr-42 from_fork", j.Task)
	}
	if s, tk := fix.Source, fix.Task; s.Actor != "bob" || !s.Trusted || tk.Author != "alice" || !tk.AuthorTrusted {
		t.Errorf("bob's review of alice's pull request: source %+v, author %q trusted %v; want bob trusted, alice trusted", s, tk.Author, tk.AuthorTrusted)
	}
	respond := decide("issue_comment__created", nil)
	if s, tk := respond.Source, respond.Task; !s.Trusted || tk.Author != "alice" || !tk.AuthorTrusted {
		t.Errorf("alice's mention on her issue: source %+v, author %q trusted %v", s, tk.Author, tk.AuthorTrusted)
	}
	body, h := fixture(t, "plane/issue__updated_labels")
	d, err := Plane(reg, h[webhook.PlaneEventHeader], "d", body, now)
	if err != nil || len(d.Jobs) != 1 {
		t.Fatalf("plane label: %+v, %v", d, err)
	}
	if s := d.Jobs[0].Source; s.Actor != "alice@example.com" || !s.Trusted {
		t.Errorf("alice's label: source %+v, want alice@example.com, trusted", s)
	}
}
