package registry

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/proto"
)

func TestParse(t *testing.T) {
	r, err := Parse([]byte(`projects:
  - key: acme-api
    gitea_repo: acme/api
    plane_project: 4af9
    trusted_actors: [alice]
    agent_timeout: 45m
    pipeline: {implement: review}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := r.ByGiteaRepo("acme/api")
	if !ok || p.Key != "acme-api" || p.Label != LabelDefault || p.Mention != MentionDefault || p.DefaultBranch != "main" {
		t.Fatalf("project = %+v", p)
	}
	if p.AgentTimeout.Minutes() != 45 || !p.TrustsGitea("alice") || p.TrustsGitea("bob") {
		t.Errorf("project = %+v", p)
	}
	if q, ok := r.ByPlaneProject("4af9"); !ok || q != p {
		t.Errorf("ByPlaneProject = %v, %v", q, ok)
	}
}

// parseError is a file Parse refuses, and what its error must name.
type parseError struct{ name, yaml, want string }

// checkParseErrors checks that Parse refuses each file with an error
// naming what the case wants.
func checkParseErrors(t *testing.T, tests []parseError) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// A bad file names the line of the problem.
func TestParseErrorsNameTheLine(t *testing.T) {
	checkParseErrors(t, []parseError{
		{"unknown key", "projects:\n  - key: a\n    gitea_repo: x/y\n    lable: agent\n", "line 4"},
		{"bad key", "projects:\n  - key: a\n    gitea_repo: x/y\n  - key: Bad Key\n    gitea_repo: x/z\n", "line 4"},
		{"duplicate repo", "projects:\n  - key: a\n    gitea_repo: x/y\n  - key: b\n    gitea_repo: x/y\n", "line 4"},
		{"no source", "projects:\n  - key: a\n", "line 2"},
		{"unknown pipeline kind", "projects:\n  - key: a\n    gitea_repo: x/y\n    pipeline: {implement: deploy}\n", "line 2"},
		{"not yaml", "projects: [\n", "line"},
		{"unknown writeback", "projects:\n  - key: a\n    gitea_repo: x/y\n    writeback: comments\n", "line 2"},
	})
}

func TestEmptyFileIsAnEmptyRegistry(t *testing.T) {
	r, err := Parse(nil)
	if err != nil || len(r.Projects()) != 0 {
		t.Fatalf("Parse(nil) = %v, %v", r, err)
	}
}

// The writeback key picks what is written back; empty means both.
func TestWriteback(t *testing.T) {
	for _, tt := range []struct {
		value           string
		comment, status bool
	}{
		{"", true, true},
		{WritebackBoth, true, true},
		{WritebackComment, true, false},
		{WritebackStatus, false, true},
		{WritebackOff, false, false},
	} {
		r, err := Parse([]byte("projects:\n  - key: a\n    plane_project: p1\n    plane_workspace: acme\n    writeback: \"" + tt.value + "\"\n"))
		if err != nil {
			t.Fatalf("writeback %q: %v", tt.value, err)
		}
		p, _ := r.ByKey("a")
		if p.WritesComment() != tt.comment || p.WritesStatus() != tt.status || p.PlaneWorkspace != "acme" {
			t.Errorf("writeback %q: comment %v, status %v, workspace %q; want %v, %v, acme", tt.value, p.WritesComment(), p.WritesStatus(), p.PlaneWorkspace, tt.comment, tt.status)
		}
	}
}

// agent_permissions decodes into a setting for every kind and settings
// per kind, keyed by proto.Kind; which setting a job gets, and the
// defaults, are the runner's (services/runner/agent).
func TestAgentPermissions(t *testing.T) {
	r, err := Parse([]byte(`projects:
  - key: custom
    gitea_repo: acme/custom
    agent_permissions:
      mode: acceptEdits
      allowed_tools: ["Bash(go test:*)", Read]
      kinds:
        review: {allowed_tools: [Read, Grep], disallowed_tools: [Bash]}
    git_author: {name: orch bot, email: bot@example.com}
  - key: plain
    gitea_repo: acme/plain
`))
	if err != nil {
		t.Fatal(err)
	}
	custom, _ := r.ByKey("custom")
	plain, _ := r.ByKey("plain")
	want := &AgentPermissions{
		Permissions: Permissions{Mode: "acceptEdits", AllowedTools: []string{"Bash(go test:*)", "Read"}},
		Kinds: map[proto.Kind]Permissions{
			proto.KindReview: {AllowedTools: []string{"Read", "Grep"}, DisallowedTools: []string{"Bash"}},
		},
	}
	if !reflect.DeepEqual(custom.AgentPermissions, want) {
		t.Errorf("agent_permissions = %+v, want %+v", custom.AgentPermissions, want)
	}
	if plain.AgentPermissions != nil {
		t.Errorf("a project without agent_permissions has %+v", plain.AgentPermissions)
	}
	if !(Permissions{}).Empty() || want.Permissions.Empty() || (Permissions{DisallowedTools: []string{"Bash"}}).Empty() {
		t.Error("Empty does not say whether a setting sets anything")
	}
	if a := custom.GitAuthor; a == nil || a.Name != "orch bot" || a.Email != "bot@example.com" || plain.GitAuthor != nil {
		t.Errorf("git_author = %+v, %+v", custom.GitAuthor, plain.GitAuthor)
	}
}

func TestAgentPermissionsErrorsNameTheLine(t *testing.T) {
	checkParseErrors(t, []parseError{
		{"bad mode", "projects:\n  - key: a\n    gitea_repo: x/y\n    agent_permissions: {mode: yolo}\n", `line 4: project "a": agent_permissions: mode "yolo"`},
		{"bad kind", "projects:\n  - key: a\n    gitea_repo: x/y\n    agent_permissions:\n      kinds:\n        review: {mode: plan}\n        deploy: {mode: plan}\n", `line 7: project "a": agent_permissions: kinds: "deploy" is not a kind an agent runs: want one of [implement review fix respond]`},
		{"cleanup is no agent's", "projects:\n  - key: a\n    gitea_repo: x/y\n    agent_permissions: {kinds: {cleanup: {mode: plan}}}\n", `line 4: project "a": agent_permissions: kinds: "cleanup" is not`},
		{"empty tool of a kind", "projects:\n  - key: a\n    gitea_repo: x/y\n    agent_permissions:\n      kinds:\n        fix: {allowed_tools: [\"\"]}\n", `line 6: project "a": agent_permissions: kinds: fix: empty tool name`},
		{"misspelt key", "projects:\n  - key: a\n    gitea_repo: x/y\n    agent_permissions: {allowed_tool: [Bash]}\n", "line 4"},
		{"author without email", "projects:\n  - key: a\n    gitea_repo: x/y\n    git_author: {name: bot}\n", "line 2: project \"a\": git_author"},
	})
}

// sparse_checkout takes directories of the repository, and refuses what
// git's cone mode would not read as one, naming the line.
func TestSparseCheckout(t *testing.T) {
	t.Parallel()
	r, err := Parse([]byte("projects:\n  - key: a\n    gitea_repo: x/y\n    sparse_checkout: [services/api, docs/]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := r.ByKey("a"); !slices.Equal(p.SparseCheckout, []string{"services/api", "docs/"}) {
		t.Errorf("sparse_checkout = %q", p.SparseCheckout)
	}
	var bad []parseError
	for _, d := range []string{"/abs", "../up", "a/../b", "*.go", "!a", "", ".git", "a//b"} {
		bad = append(bad, parseError{d, fmt.Sprintf("projects:\n  - key: a\n    gitea_repo: x/y\n    sparse_checkout: [%q]\n", d), `line 2: project "a": sparse_checkout`})
	}
	checkParseErrors(t, bad)
}

// trusted_actors entries name a person in one system: typed ones in the
// system they name, untyped ones as registries have always written them
// (a Gitea login, or a Plane member's e-mail), and display names never.
func TestTrustedActors(t *testing.T) {
	t.Parallel()
	const (
		carolID = "6bb20d1c-4960-41ca-af4f-cee01de160c4"
		daveID  = "9b1e0000-0000-4000-8000-00000000a6e7"
	)
	r, err := Parse([]byte(`projects:
  - key: a
    gitea_repo: x/y
    trusted_actors:
      - gitea:bob
      - plane:` + carolID + `
      - plane:Bob@Example.com
      - alice
      - erin@example.com
      - ` + daveID + `
`))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := r.ByKey("a")
	gitea := map[string]bool{
		"bob": true, "BOB": true, "alice": true, "Alice": true,
		"bob@example.com": false, "erin@example.com": false, "erin": false,
		carolID: false, daveID: false, "mallory": false, "": false,
	}
	for login, want := range gitea {
		if got := p.TrustsGitea(login); got != want {
			t.Errorf("TrustsGitea(%q) = %v, want %v", login, got, want)
		}
	}
	plane := []struct {
		id, email string
		want      bool
	}{
		{carolID, "", true},
		{strings.ToUpper(carolID), "", true},
		{daveID, "", true},
		{"", "bob@example.com", true},
		{"", "erin@EXAMPLE.com", true},
		{"u-1", "erin@example.com", true},
		// gitea:bob and alice are Gitea logins, not Plane names.
		{"bob", "", false},
		{"alice", "", false},
		{"", "alice", false},
		{"", "mallory@example.com", false},
		{"", "", false},
	}
	for _, tt := range plane {
		if got := p.TrustsPlane(tt.id, tt.email); got != tt.want {
			t.Errorf("TrustsPlane(%q, %q) = %v, want %v", tt.id, tt.email, got, tt.want)
		}
	}
}

// A trusted_actors entry that names no one stops the load, naming the
// entry's line.
func TestTrustedActorsErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	var bad []parseError
	for _, e := range []string{"gitea:", "plane:", "github:x", "plane:alice", "gitea:a b", "gitea:bob@example.com", "Alice Dev", "", ":x"} {
		y := fmt.Sprintf("projects:\n  - key: a\n    gitea_repo: x/y\n    trusted_actors:\n      - alice\n      - %q\n", e)
		bad = append(bad, parseError{e, y, fmt.Sprintf(`line 6: project "a": trusted_actors entry %q`, e)})
	}
	bad = append(bad, parseError{"flow sequence", "projects:\n  - key: a\n    gitea_repo: x/y\n    trusted_actors: [alice, \"gitlab:bob\"]\n", `line 4: project "a": trusted_actors entry "gitlab:bob": unknown system "gitlab"`})
	checkParseErrors(t, bad)
}

// plane_agent_app turns Plane's agent runs on; the runs API's paths need
// the workspace's slug, so it needs plane_workspace beside plane_project.
func TestPlaneAgentApp(t *testing.T) {
	t.Parallel()
	r, err := Parse([]byte("projects:\n  - key: a\n    plane_project: p1\n    plane_workspace: acme\n    plane_agent_app: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := r.ByKey("a"); !p.PlaneAgentApp {
		t.Error("plane_agent_app not read")
	}
	checkParseErrors(t, []parseError{
		{"no workspace", "projects:\n  - key: a\n    plane_project: p1\n    plane_agent_app: true\n", `line 2: project "a": plane_agent_app needs plane_project and plane_workspace`},
	})
}

// The spend keys: a budget, a cap as a number or a map by kind, turns and
// supersede; a negative limit or an unknown supersede is refused.
func TestSpendKeys(t *testing.T) {
	r, err := Parse([]byte(`
projects:
  - key: a
    gitea_repo: acme/a
    budget: {daily_usd: 1.5, monthly_usd: 20}
    max_cost_usd: 0.5
    max_turns: 12
    supersede: running
  - key: b
    gitea_repo: acme/b
    max_cost_usd: {review: 0.25, implement: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := r.ByKey("a")
	b, _ := r.ByKey("b")
	if a.Budget.Limit("day") != 1.5 || a.Budget.Limit("month") != 20 || a.MaxCostUSD.For("review") != 0.5 ||
		a.MaxTurns != 12 || a.Supersede != SupersedeRunning {
		t.Errorf("project a: %+v", a)
	}
	if b.MaxCostUSD.For("review") != 0.25 || b.MaxCostUSD.For("implement") != 2 || b.MaxCostUSD.For("respond") != 0 || b.Budget.Limit("day") != 0 {
		t.Errorf("project b: %+v", b)
	}
	for _, bad := range []string{"budget: {daily_usd: -1}", "max_cost_usd: -2", "max_turns: -1", "supersede: always"} {
		if _, err := Parse([]byte("projects:\n  - key: a\n    gitea_repo: acme/a\n    " + bad + "\n")); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// max_concurrency and priority are read and checked; a kind's priority
// defaults by kind and the registry overrides it.
func TestMaxConcurrencyAndPriority(t *testing.T) {
	r, err := Parse([]byte("projects:\n  - key: a\n    gitea_repo: x/y\n    max_concurrency: 2\n    priority: {fix: high, respond: low}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := r.ByKey("a")
	if p.MaxConcurrency != 2 {
		t.Errorf("max_concurrency %d, want 2", p.MaxConcurrency)
	}
	for kind, want := range map[proto.Kind]int{proto.KindFix: 2, proto.KindRespond: 0, proto.KindReview: 2, proto.KindImplement: 1, proto.KindCleanup: 0} {
		if got := p.PriorityOf(kind); got != want {
			t.Errorf("priority of %s: %d, want %d", kind, got, want)
		}
	}
	for _, bad := range []string{"max_concurrency: -1", "priority: {fix: urgent}", "priority: {deploy: high}"} {
		if _, err := Parse([]byte("projects:\n  - key: a\n    gitea_repo: x/y\n    " + bad + "\n")); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
