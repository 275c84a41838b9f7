package runner

import (
	"testing"

	"github.com/orch-dev/orch/kit/registry"
)

// spare_worktree: false in the registry reaches the workspace as NoSpare;
// unset or true keeps the spare.
func TestSpareWorktreeSwitch(t *testing.T) {
	reg, err := registry.Parse([]byte("projects:\n" +
		"  - {key: off, gitea_repo: x/off, spare_worktree: false}\n" +
		"  - {key: on, gitea_repo: x/on, spare_worktree: true}\n" +
		"  - {key: unset, gitea_repo: x/unset}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"off": true, "on": false, "unset": false} {
		p, _ := reg.ByKey(key)
		if got := repoOf(p).NoSpare; got != want {
			t.Errorf("project %s: NoSpare %v, want %v", key, got, want)
		}
	}
}
