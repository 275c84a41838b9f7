package taskstate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// One git status gives the head, the branch, whether tracked files
// changed (a staged rename among them, whose original path follows it)
// and the untracked files, those in new directories and with spaces
// included, the ignored ones not.
func TestReadStatus(t *testing.T) {
	dir := t.TempDir()
	gitT := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	gitT("init", "-q", "-b", "agent/t")
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("*.log\n"), 0o644)
	gitT("add", ".")
	gitT("commit", "-q", "-m", "one")
	ctx := context.Background()
	st, err := readStatus(ctx, dir)
	if err != nil || st.branch != "agent/t" || len(st.head) != 40 || st.dirty() {
		t.Fatalf("clean: %+v, %v", st, err)
	}
	gitT("mv", "a.txt", "b.txt")
	os.MkdirAll(filepath.Join(dir, "new dir"), 0o755)
	os.WriteFile(filepath.Join(dir, "new dir", "c d.txt"), []byte("c\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "e.txt"), []byte("e\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "x.log"), []byte("ignored\n"), 0o644)
	st, err = readStatus(ctx, dir)
	if err != nil || !st.tracked || !slices.Equal(st.untracked, []string{"e.txt", "new dir/c d.txt"}) {
		t.Fatalf("changed: %+v, %v", st, err)
	}
}
