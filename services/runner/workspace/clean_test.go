package workspace

import (
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A worktree nobody touched since it was made (or since git found it
// clean) is known clean without git; every kind of change since, even one
// in the same clock tick as the checkout, makes the job ask git, which
// names it in the notes.
func TestKnownClean(t *testing.T) {
	ctx := context.Background()
	run := func(dir string, args ...string) {
		t.Helper()
		args = append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		named  string // in the notes; "" for none
	}{
		{"untouched", func(*testing.T, string) {}, ""},
		{"task file", func(t *testing.T, dir string) { write(t, dir, ".orch/task-x.md", "task") }, ""},
		{"same-size edit", func(t *testing.T, dir string) { write(t, dir, "src/a.txt", "b\n") }, "src/a.txt"},
		{"untracked file", func(t *testing.T, dir string) { write(t, dir, "src/new.txt", "new\n") }, "src/new.txt"},
		{"deleted file", func(t *testing.T, dir string) { _ = os.Remove(filepath.Join(dir, "README.md")) }, "README.md"},
		{"mode change", func(t *testing.T, dir string) { _ = os.Chmod(filepath.Join(dir, "README.md"), 0o755) }, "README.md"},
		{"staged file", func(t *testing.T, dir string) {
			write(t, dir, "staged.txt", "staged\n")
			run(dir, "add", "staged.txt")
		}, "staged.txt"},
		{"staged edit, file restored", func(t *testing.T, dir string) {
			write(t, dir, "README.md", "staged\n")
			run(dir, "add", "README.md")
			write(t, dir, "README.md", "hello\n")
		}, "README.md"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws, repo, want, co := taskWorktree(t)
			own, err := worktreeGitDir(co.Dir)
			if err != nil {
				t.Fatal(err)
			}
			gitDir, _ := ws.RepoDir("widgets")
			wt := worktree{dir: co.Dir, gitDir: gitDir, own: own}
			if !wt.knownClean(co.Head) {
				t.Fatal("an untouched worktree is not known clean: every job runs git status")
			}
			if co, err = ws.Prepare(ctx, repo, want); err != nil || len(co.Uncommitted) != 0 {
				t.Fatalf("untouched worktree: %v, uncommitted %q", err, co.Uncommitted)
			}

			tc.change(t, co.Dir)
			if known := wt.knownClean(co.Head); known != (tc.named == "") {
				t.Errorf("known clean %v after the change, want %v", known, tc.named == "")
			}
			co, err = ws.Prepare(ctx, repo, want)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(co.Uncommitted, "; ")
			if tc.named == "" && got != "" || !strings.Contains(got, tc.named) {
				t.Errorf("uncommitted %q, want %q named", got, tc.named)
			}
		})
	}
}

// taskWorktree makes a repository of README.md and src/a.txt and, in a
// new workspace, the worktree of the first job of task t-1.
func taskWorktree(t *testing.T) (*Workspace, Repo, Want, Checkout) {
	t.Helper()
	ctx := context.Background()
	remote := filepath.Join(t.TempDir(), "remote")
	if err := CreateRepo(ctx, remote, "main", map[string]string{"README.md": "hello\n", "src/a.txt": "a\n"}); err != nil {
		t.Fatal(err)
	}
	ws := &Workspace{Root: t.TempDir()}
	repo := Repo{Project: "widgets", CloneURL: remote, DefaultBranch: "main"}
	want := Want{Task: "t-1"}
	co, err := ws.Prepare(ctx, repo, want)
	if err != nil {
		t.Fatal(err)
	}
	return ws, repo, want, co
}

func write(t *testing.T, dir, name, text string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An entry written in the index's clock tick is judged by its content:
// the blob id of the file as it is, which must be git's.
func TestRacyEntriesJudgedByContent(t *testing.T) {
	ctx := context.Background()
	remote := filepath.Join(t.TempDir(), "remote")
	if err := CreateRepo(ctx, remote, "main", map[string]string{"README.md": "hello\n", "src/a.txt": "a\n"}); err != nil {
		t.Fatal(err)
	}
	ws := &Workspace{Root: t.TempDir()}
	co, err := ws.Prepare(ctx, Repo{Project: "widgets", CloneURL: remote, DefaultBranch: "main"}, Want{Task: "t-1"})
	if err != nil {
		t.Fatal(err)
	}
	own, err := worktreeGitDir(co.Dir)
	if err != nil {
		t.Fatal(err)
	}
	index, err := os.ReadFile(filepath.Join(own, "index"))
	if err != nil {
		t.Fatal(err)
	}
	// An index time of zero makes every entry racily clean.
	if _, ok := indexMatches(co.Dir, index, 20, syscall.Timespec{}); !ok {
		t.Error("clean worktree, every entry checked by content: not matching git's blob ids")
	}
	oid, err := hex.DecodeString(strings.TrimSpace(gitOut(t, co.Dir, "rev-parse", "HEAD:README.md")))
	if err != nil {
		t.Fatal(err)
	}
	readme := filepath.Join(co.Dir, "README.md")
	if !blobMatches(readme, 0o100644, oid) {
		t.Error("README.md does not hash to its blob")
	}
	write(t, co.Dir, "README.md", "HELLO\n")
	if blobMatches(readme, 0o100644, oid) {
		t.Error("an edited README.md hashes to the old blob")
	}
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return string(out)
}

// Where git status answers (the worktree is not known clean), files made
// after an earlier status are still named though git keeps an untracked
// cache, and a new directory is named as itself.
func TestUntrackedSeenThroughGitsCache(t *testing.T) {
	t.Parallel()
	ws, repo, want, co := taskWorktree(t)
	uncommitted := func() string {
		t.Helper()
		co, err := ws.Prepare(context.Background(), repo, want)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(co.Uncommitted, "; ")
	}
	write(t, co.Dir, "README.md", "edited\n")
	if got := uncommitted(); !strings.Contains(got, "README.md") {
		t.Fatalf("uncommitted %q, want README.md", got)
	}
	write(t, co.Dir, "src/late.txt", "late\n")
	if got := uncommitted(); !strings.Contains(got, "src/late.txt") {
		t.Errorf("uncommitted %q, want src/late.txt, made after the last status", got)
	}
	write(t, co.Dir, "newdir/x.txt", "x\n")
	write(t, co.Dir, "newdir/y.txt", "y\n")
	if got := uncommitted(); !strings.Contains(got, "?? newdir/") || strings.Contains(got, "x.txt") {
		t.Errorf("uncommitted %q, want the new directory as itself", got)
	}
}
