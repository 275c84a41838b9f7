package registry

import (
	"strings"
	"testing"
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
	if p.AgentTimeout.Minutes() != 45 || !p.Trusts("bob", "alice") || p.Trusts("bob") {
		t.Errorf("project = %+v", p)
	}
	if q, ok := r.ByPlaneProject("4af9"); !ok || q != p {
		t.Errorf("ByPlaneProject = %v, %v", q, ok)
	}
}

// A bad file names the line of the problem.
func TestParseErrorsNameTheLine(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"unknown key", "projects:\n  - key: a\n    gitea_repo: x/y\n    lable: agent\n", "line 4"},
		{"bad key", "projects:\n  - key: a\n    gitea_repo: x/y\n  - key: Bad Key\n    gitea_repo: x/z\n", "line 4"},
		{"duplicate repo", "projects:\n  - key: a\n    gitea_repo: x/y\n  - key: b\n    gitea_repo: x/y\n", "line 4"},
		{"no source", "projects:\n  - key: a\n", "line 2"},
		{"unknown pipeline kind", "projects:\n  - key: a\n    gitea_repo: x/y\n    pipeline: {implement: deploy}\n", "line 2"},
		{"not yaml", "projects: [\n", "line"},
		{"unknown writeback", "projects:\n  - key: a\n    gitea_repo: x/y\n    writeback: comments\n", "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v, want an error naming %q", err, tt.want)
			}
		})
	}
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
