package agent

import (
	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
)

// reviewTools are what a review needs without asking: reading the code and
// its history. Build and test commands are the project's own to add.
var reviewTools = []string{
	"Read", "Glob", "Grep",
	"Bash(git diff:*)", "Bash(git log:*)", "Bash(git show:*)", "Bash(git status:*)", "Bash(git blame:*)",
}

// changeTools are what a job that changes the code needs: any command
// (builds, tests, git commit and push), file edits by mode acceptEdits.
var changeTools = []string{"Bash", "Read", "Glob", "Grep", "Edit", "Write"}

// DefaultPermissions is Claude Code's setting for each kind an agent runs,
// for a project that sets none. A review reads and runs read-only git
// commands, and cannot edit; implement, fix and respond (a mention may ask
// for a change) edit files and run any command in their worktree. Without
// a setting print mode would deny every tool call that needs approval, so
// every kind for which proto's RunsAgent holds has one (a test checks).
var DefaultPermissions = map[proto.Kind]registry.Permissions{
	proto.KindReview:    {Mode: "default", AllowedTools: reviewTools, DisallowedTools: []string{"Edit", "Write", "NotebookEdit"}},
	proto.KindImplement: {Mode: "acceptEdits", AllowedTools: changeTools},
	proto.KindFix:       {Mode: "acceptEdits", AllowedTools: changeTools},
	proto.KindRespond:   {Mode: "acceptEdits", AllowedTools: changeTools},
}

// Permissions is Claude Code's setting for a job of kind in a project whose
// agent_permissions is set (nil when the project sets none): the setting
// for the kind, else the project's setting for every kind when it sets
// anything, else DefaultPermissions. A project's setting replaces the
// default whole, so that a project can take a tool away.
func Permissions(set *registry.AgentPermissions, kind proto.Kind) registry.Permissions {
	if set != nil {
		if k, ok := set.Kinds[kind]; ok {
			return k
		}
		if !set.Permissions.Empty() {
			return set.Permissions
		}
	}
	return DefaultPermissions[kind]
}
