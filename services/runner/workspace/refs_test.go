package workspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The in-process ref reader answers as git does, for loose, packed,
// symbolic and missing refs, and for a name that is a directory of refs.
func TestReadRefAgreesWithGit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := CreateRepo(ctx, repo, "main", map[string]string{"a.txt": "a\n"}); err != nil {
		t.Fatal(err)
	}
	bare := filepath.Join(dir, "bare.git")
	run := func(dir string, args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run(dir, "clone", "-q", "--bare", repo, bare)
	run(bare, "branch", "feature/packed", "main")
	run(bare, "pack-refs", "--all", "--prune")
	run(bare, "branch", "feature/loose", "main")
	run(bare, "symbolic-ref", "refs/heads/sym", "refs/heads/feature/loose")

	for _, ref := range []string{"HEAD", "refs/heads/main", "refs/heads/feature/packed", "refs/heads/feature/loose",
		"refs/heads/sym", "refs/heads/feature", "refs/heads/missing", "refs/remotes/origin/main"} {
		want := ""
		if out, err := exec.Command("git", "-C", bare, "rev-parse", "--verify", "--quiet", ref).Output(); err == nil {
			want = strings.TrimSpace(string(out))
		}
		got, err := readRef(bare, ref)
		if err != nil || got != want {
			t.Errorf("readRef(%s) = %q, %v; git says %q", ref, got, err, want)
		}
	}
	if _, err := readRef(bare, "refs/../config"); err == nil {
		t.Error("readRef read a path outside refs/")
	}
}

// The in-process branch name check is never looser than git
// check-ref-format --branch, and stricter only where it means to be.
func TestBranchNameAgreesWithGit(t *testing.T) {
	t.Parallel()
	// "@" is git's shorthand for HEAD's branch: never taken as a name.
	stricter := map[string]bool{"@": true}
	notRepo := t.TempDir() // where git reads "@" and "@{-1}" as names
	for _, name := range []string{
		"feature/x", "fix-emoji", "release/1.2", "ü/ñ", "emoji-🎉", "x@y", "a.b", "a-", "a_b", "a/b/c",
		"", "@", "-x", "x/", "x.", "/x", "a//b", "a..b", "a/.b", ".a", "a.lock", "a/b.lock/c", "a.lock/b",
		"a@{b", "@{-1}", "a b", "a~b", "a^", "a:b", "a?", "a*", "a[b", "a\\b", "a\x01b", "a\x7fb", "a\tb",
		"HEAD", "refs/heads/x", "a/./b", "x/@", "a.lock.b", "foo\xffbar",
	} {
		cmd := exec.Command("git", "check-ref-format", "--branch", name)
		cmd.Dir = notRepo
		gitOK := cmd.Run() == nil
		switch ok := branchNameOK(name); {
		case ok && !gitOK:
			t.Errorf("%q: taken in-process, git refuses it", name)
		case !ok && gitOK && !stricter[name]:
			t.Errorf("%q: refused in-process, git takes it", name)
		}
	}
}

// The worktree records read in-process name the same holder of a branch
// as git worktree list: another task's worktree, none for the worktree's
// own branch or a branch no worktree has, none for a worktree whose
// directory is gone.
func TestHolderAgreesWithGit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	remote := filepath.Join(dir, "remote")
	if err := CreateRepo(ctx, remote, "main", map[string]string{"a.txt": "a\n"}); err != nil {
		t.Fatal(err)
	}
	gitDir := filepath.Join(dir, "clone.git")
	if out, err := exec.Command("git", "clone", "-q", "--bare", remote, gitDir).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	add := func(name, branch string) string {
		t.Helper()
		wt := filepath.Join(dir, name)
		if out, err := exec.Command("git", "-C", gitDir, "worktree", "add", "-q", "-b", branch, wt, "main").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return wt
	}
	if path, err := holderOf(gitDir, "feature/x", filepath.Join(dir, "none")); err != nil || path != "" {
		t.Fatalf("no worktree yet: holder %q, %v", path, err)
	}
	pr7 := add("pr-7", "feature/x")
	pr8 := add("pr-8", "agent/pr-8")
	gone := add("gone", "feature/gone")
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		branch, dir, want string
	}{
		{"feature/x", pr8, pr7},
		{"feature/x", pr7, ""},
		{"agent/pr-8", pr7, pr8},
		{"feature/none", pr8, ""},
		{"feature/gone", pr8, ""},
	} {
		inProcess, err := holderOf(gitDir, tc.branch, tc.dir)
		if err != nil {
			t.Fatalf("%s: %v", tc.branch, err)
		}
		byGit := holderByGit(ctx, gitDir, tc.branch, tc.dir)
		if inProcess != tc.want || byGit != tc.want {
			t.Errorf("holder of %s from %s: in-process %q, git %q, want %q", tc.branch, filepath.Base(tc.dir), inProcess, byGit, tc.want)
		}
	}
}
