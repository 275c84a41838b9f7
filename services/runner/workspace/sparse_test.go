package workspace_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/services/runner/workspace"
)

// A project with sparse_checkout gets worktrees holding only those
// directories and the files at the top; the jobs in it see a clean
// worktree, and an edit there is named as in any other.
func TestSparseWorktree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	remote := filepath.Join(t.TempDir(), "remote")
	if err := workspace.CreateRepo(ctx, remote, "main", map[string]string{
		"README.md": "hello\n", "api/main.go": "package main\n", "web/app.js": "app\n", "web/deep/x.js": "x\n",
	}); err != nil {
		t.Fatal(err)
	}
	ws := &workspace.Workspace{Root: t.TempDir()}
	repo := workspace.Repo{Project: "mono", CloneURL: remote, DefaultBranch: "main", Sparse: []string{"api"}}
	want := workspace.Want{Task: "wid-7"}
	co := prepare(t, ws, repo, want)
	for file, there := range map[string]bool{"README.md": true, "api/main.go": true, "web/app.js": false, "web/deep/x.js": false} {
		if _, err := os.Stat(filepath.Join(co.Dir, file)); (err == nil) != there {
			t.Errorf("%s in the worktree: %v, want %v", file, err == nil, there)
		}
	}
	if st := gitOut(t, co.Dir, "status", "--porcelain"); st != "" || len(co.Notes) != 0 {
		t.Fatalf("new sparse worktree: status %q, notes %q", st, co.Notes)
	}

	if co = prepare(t, ws, repo, want); len(co.Notes) != 0 || len(co.Uncommitted) != 0 {
		t.Fatalf("second job: notes %q, uncommitted %q", co.Notes, co.Uncommitted)
	}
	write(t, filepath.Join(co.Dir, "api", "main.go"), "package main // edited\n")
	if co = prepare(t, ws, repo, want); !strings.Contains(notes(co), "api/main.go") {
		t.Errorf("an edit in the sparse worktree is not named: %q", co.Notes)
	}
}
