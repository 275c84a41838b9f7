package agent_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
)

// A job gets its kind's setting, else the project's setting for every
// kind, else the kind's default.
func TestPermissions(t *testing.T) {
	t.Parallel()
	reg, err := registry.Parse([]byte(`projects:
  - key: custom
    gitea_repo: acme/custom
    agent_permissions:
      mode: acceptEdits
      allowed_tools: ["Bash(go test:*)", Read]
      kinds:
        review: {allowed_tools: [Read, Grep], disallowed_tools: [Bash]}
  - key: perkind
    gitea_repo: acme/perkind
    agent_permissions:
      kinds:
        fix: {mode: plan}
  - key: plain
    gitea_repo: acme/plain
`))
	if err != nil {
		t.Fatal(err)
	}
	project := func(key string) *registry.AgentPermissions {
		p, ok := reg.ByKey(key)
		if !ok {
			t.Fatalf("no project %s", key)
		}
		return p.AgentPermissions
	}
	tests := []struct {
		project string
		kind    proto.Kind
		want    registry.Permissions
	}{
		{"custom", proto.KindReview, registry.Permissions{AllowedTools: []string{"Read", "Grep"}, DisallowedTools: []string{"Bash"}}},
		{"custom", proto.KindFix, registry.Permissions{Mode: "acceptEdits", AllowedTools: []string{"Bash(go test:*)", "Read"}}},
		{"perkind", proto.KindFix, registry.Permissions{Mode: "plan"}},
		{"perkind", proto.KindReview, agent.DefaultPermissions[proto.KindReview]},
		{"plain", proto.KindReview, agent.DefaultPermissions[proto.KindReview]},
		{"plain", proto.KindImplement, agent.DefaultPermissions[proto.KindImplement]},
	}
	for _, tt := range tests {
		if got := agent.Permissions(project(tt.project), tt.kind); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s %s: got %+v, want %+v", tt.project, tt.kind, got, tt.want)
		}
	}
}

// Every kind an agent runs has a default that lets it work unattended, and
// no other kind has one; a review cannot edit.
func TestDefaultPermissionsCoverEveryAgentKind(t *testing.T) {
	t.Parallel()
	agentKinds := 0
	for _, kind := range proto.Kinds {
		if kind.RunsAgent() {
			agentKinds++
		}
		p, ok := agent.DefaultPermissions[kind]
		switch {
		case kind.RunsAgent() && (p.Mode == "" || len(p.AllowedTools) == 0):
			t.Errorf("no default permissions for %s: %+v", kind, p)
		case !kind.RunsAgent() && ok:
			t.Errorf("%s runs no agent, yet has default permissions %+v", kind, p)
		}
	}
	if len(agent.DefaultPermissions) != agentKinds {
		t.Errorf("DefaultPermissions names kinds proto does not: %v", agent.DefaultPermissions)
	}
	review := agent.DefaultPermissions[proto.KindReview]
	for _, tool := range []string{"Edit", "Write"} {
		if !slices.Contains(review.DisallowedTools, tool) {
			t.Errorf("a review may %s: %+v", tool, review)
		}
	}
}
