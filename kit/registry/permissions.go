package registry

import (
	"fmt"
	"slices"

	"github.com/orch-dev/orch/proto"
)

// Permissions is what Claude Code may do without asking, mapped to its
// flags: print mode cannot ask anyone, so a tool call these do not allow
// is denied, and the runner fails the job. Runners add the flags only when
// the agent command is Claude Code.
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

// AgentPermissions is a project's agent_permissions: one setting for every
// kind, and per kind settings that replace it.
type AgentPermissions struct {
	// Permissions applies to every kind that Kinds does not name, when it
	// sets anything; otherwise those kinds get DefaultPermissions.
	Permissions `yaml:",inline"`
	// Kinds replaces the setting of a kind ("review", "implement", ...).
	Kinds map[string]Permissions `yaml:"kinds"`
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

// reviewTools are what a review needs without asking: reading the code and
// its history. Build and test commands are the project's own to add.
var reviewTools = []string{
	"Read", "Glob", "Grep",
	"Bash(git diff:*)", "Bash(git log:*)", "Bash(git show:*)", "Bash(git status:*)", "Bash(git blame:*)",
}

// changeTools are what a job that changes the code needs: any command
// (builds, tests, git commit and push), file edits by mode acceptEdits.
var changeTools = []string{"Bash", "Read", "Glob", "Grep", "Edit", "Write"}

// DefaultPermissions is the setting of each kind for a project that sets
// none. A review reads and runs read-only git commands, and cannot edit;
// implement, fix and respond (a mention may ask for a change) edit files
// and run any command in their worktree.
var DefaultPermissions = map[string]Permissions{
	"review":    {Mode: "default", AllowedTools: reviewTools, DisallowedTools: []string{"Edit", "Write", "NotebookEdit"}},
	"implement": {Mode: "acceptEdits", AllowedTools: changeTools},
	"fix":       {Mode: "acceptEdits", AllowedTools: changeTools},
	"respond":   {Mode: "acceptEdits", AllowedTools: changeTools},
}

// Permissions returns the setting of kind for this project: its
// agent_permissions for the kind, else its setting for every kind, else
// DefaultPermissions.
func (p *Project) Permissions(kind string) Permissions {
	if ap := p.AgentPermissions; ap != nil {
		if k, ok := ap.Kinds[kind]; ok {
			return k
		}
		if !ap.Permissions.empty() {
			return ap.Permissions
		}
	}
	return DefaultPermissions[kind]
}

func (p Permissions) empty() bool {
	return p.Mode == "" && len(p.AllowedTools) == 0 && len(p.DisallowedTools) == 0
}

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

func (a *AgentPermissions) check() error {
	if a == nil {
		return nil
	}
	if err := a.Permissions.check(); err != nil {
		return err
	}
	for kind, p := range a.Kinds {
		if !proto.Kind(kind).RunsAgent() {
			return fmt.Errorf("kinds: %q is not a kind an agent runs", kind)
		}
		if err := p.check(); err != nil {
			return fmt.Errorf("kinds: %s: %w", kind, err)
		}
	}
	return nil
}
