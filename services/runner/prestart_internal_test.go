package runner

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A sandbox made ahead binds a worktree's directory, its .git file and
// the task's home as they were: a worktree made again meanwhile (removed
// and added, or its .git file written anew) is not what the sandbox
// holds, and identify tells it apart, so its sandbox is not used.
func TestIdentifySeesAWorktreeMadeAgain(t *testing.T) {
	root := t.TempDir()
	dir, home := filepath.Join(root, "worktree"), filepath.Join(root, "home")
	dotGit := filepath.Join(dir, ".git")
	write := func(path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(dotGit, "gitdir: /clone/worktrees/a\n")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	bound := []string{dir, dotGit, home}
	ids := identify(bound)
	if !slices.Equal(ids, identify(bound)) {
		t.Fatal("the same files are not identified alike")
	}
	write(filepath.Join(dir, "file.go"), "changed inside\n")
	if !slices.Equal(ids, identify(bound)) {
		t.Error("a file changed inside the worktree counts as a worktree made again")
	}
	write(dotGit, "gitdir: /clone/worktrees/a\n")
	if slices.Equal(ids, identify(bound)) {
		t.Error("a .git file written anew is not told apart")
	}
	ids = identify(bound)
	// The sandbox's mount holds the directory it bound, so its inode is
	// not free for the new one's: an open descriptor holds it here.
	held, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	write(dotGit, "gitdir: /clone/worktrees/a\n")
	if slices.Equal(ids, identify(bound)) {
		t.Error("a worktree removed and made again is not told apart")
	}
}
