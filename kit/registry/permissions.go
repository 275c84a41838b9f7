package registry

import (
	"fmt"
	"maps"
	"slices"

	"github.com/orch-dev/orch/proto"
	"go.yaml.in/yaml/v3"
)

// Permissions is what Claude Code may do without asking, mapped to its
// flags: print mode cannot ask anyone, so a tool call these do not allow
// is denied, and the runner fails the job. Runners add the flags only when
// the agent command is Claude Code; what a kind gets when a project sets
// nothing is the runner's policy (services/runner/agent), not the
// registry's.
type Permissions struct {
	// Mode is --permission-mode: one of PermissionModes. Empty adds no
	// flag (Claude Code's "default": only read-only tools run unasked).
	Mode string `yaml:"mode"`
	// AllowedTools is --allowedTools: tool names ("Bash", "Edit") or
	// rules ("Bash(go test:*)") that run without asking.
	AllowedTools []string `yaml:"allowed_tools"`
	// DisallowedTools is --disallowedTools: tools taken away from the
	// agent altogether, so that it does not try them.
	DisallowedTools []string `yaml:"disallowed_tools"`
}

// Empty reports whether p sets nothing, so that a setting further out
// (the project's for every kind, or the runner's default) applies.
func (p Permissions) Empty() bool {
	return p.Mode == "" && len(p.AllowedTools) == 0 && len(p.DisallowedTools) == 0
}

// AgentPermissions is a project's agent_permissions: one setting for every
// kind, and per kind settings that replace it.
type AgentPermissions struct {
	// Permissions applies to every kind that Kinds does not name, when it
	// sets anything; otherwise those kinds get the runner's default.
	Permissions `yaml:",inline"`
	// Kinds replaces the setting of a kind an agent runs ("review",
	// "implement", ...); any other key stops the load, naming its line.
	Kinds map[proto.Kind]Permissions `yaml:"kinds"`
}

// GitAuthor is the identity of the agent's commits: the runner sets
// GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME and
// GIT_COMMITTER_EMAIL in the agent's environment.
type GitAuthor struct {
	Name  string `yaml:"name"`
	Email string `yaml:"email"`
}

// PermissionModes are the values of Claude Code's --permission-mode.
var PermissionModes = []string{"default", "acceptEdits", "plan", "bypassPermissions", "dontAsk"}

func (p Permissions) check() error {
	if p.Mode != "" && !slices.Contains(PermissionModes, p.Mode) {
		return fmt.Errorf("mode %q: want one of %v", p.Mode, PermissionModes)
	}
	for _, t := range append(slices.Clip(p.AllowedTools), p.DisallowedTools...) {
		if t == "" {
			return fmt.Errorf("empty tool name")
		}
	}
	return nil
}

// permError is a bad agent_permissions setting; kind names the kind
// whose setting it is, empty for the project's setting for every kind, so
// that the error can name its line.
type permError struct {
	kind proto.Kind
	msg  string
}

func (e *permError) Error() string { return "agent_permissions: " + e.msg }

// check returns the first error of the setting, kinds in name order so
// that the same file always gets the same error.
func (a *AgentPermissions) check() *permError {
	if a == nil {
		return nil
	}
	if err := a.Permissions.check(); err != nil {
		return &permError{msg: err.Error()}
	}
	for _, kind := range slices.Sorted(maps.Keys(a.Kinds)) {
		if !kind.RunsAgent() {
			return &permError{kind, fmt.Sprintf("kinds: %q is not a kind an agent runs: want one of %v", kind, agentKinds())}
		}
		if err := a.Kinds[kind].check(); err != nil {
			return &permError{kind, fmt.Sprintf("kinds: %s: %v", kind, err)}
		}
	}
	return nil
}

// agentKinds are the kinds an agent runs, for error messages.
func agentKinds() []proto.Kind {
	return slices.DeleteFunc(slices.Clone(proto.Kinds), func(k proto.Kind) bool { return !k.RunsAgent() })
}

// permLine is the line of kind under agent_permissions.kinds in a
// project's node, or of agent_permissions itself for an empty kind, or the
// project's own line if neither can be found.
func permLine(project *yaml.Node, kind proto.Kind) int {
	perms := mapValue(project, "agent_permissions")
	if perms == nil {
		return project.Line
	}
	if kind == "" {
		return perms.Line
	}
	kinds := mapValue(perms, "kinds")
	if kinds == nil {
		return perms.Line
	}
	for j := 0; j+1 < len(kinds.Content); j += 2 {
		if kinds.Content[j].Value == string(kind) {
			return kinds.Content[j].Line
		}
	}
	return kinds.Line
}

// mapValue is the value of key in a mapping node, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == key {
			return n.Content[j+1]
		}
	}
	return nil
}
