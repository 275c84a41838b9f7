package workspace_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/orch-dev/orch/services/runner/workspace"
)

// prepareDir prepares the worktree of task for a job naming head branch
// hint (and no head commit) and returns its directory.
func prepareDir(ctx context.Context, ws *workspace.Workspace, repo workspace.Repo, task, hint string) (string, error) {
	co, err := ws.Prepare(ctx, repo, workspace.Want{Task: task, HeadBranch: hint})
	return co.Dir, err
}

// mustPrepareDir is prepareDir for a test that only goes on when it
// works.
func mustPrepareDir(t *testing.T, ws *workspace.Workspace, repo workspace.Repo, task, hint string) string {
	t.Helper()
	dir, err := prepareDir(context.Background(), ws, repo, task, hint)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	args = append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func setup(t *testing.T) (*workspace.Workspace, workspace.Repo, string) {
	t.Helper()
	remote := filepath.Join(t.TempDir(), "remote")
	if err := workspace.CreateRepo(context.Background(), remote, "main", map[string]string{"README.md": "hello\n"}); err != nil {
		t.Fatal(err)
	}
	ws := &workspace.Workspace{Root: t.TempDir()}
	return ws, workspace.Repo{Project: "widgets", CloneURL: remote, DefaultBranch: "main"}, remote
}

func TestWorktreeLifecycle(t *testing.T) {
	ctx := context.Background()
	ws, repo, remote := setup(t)

	dir := mustPrepareDir(t, ws, repo, "task-1", "")
	if want := filepath.Join(ws.Root, "worktrees", "widgets", "task-1"); dir != want {
		t.Errorf("worktree at %s, want %s", dir, want)
	}
	if b := gitOut(t, dir, "rev-parse", "--abbrev-ref", "HEAD"); b != "agent/task-1" {
		t.Errorf("branch %s, want agent/task-1", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "README.md")); err != nil {
		t.Errorf("worktree lacks the default branch's files: %v", err)
	}
	// The agent commits; the task file stays out of git.
	if _, err := ws.TaskFile(dir, "job-1", "task"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "work.txt"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitOut(t, dir, "add", "--all")
	gitOut(t, dir, "commit", "-q", "-m", "work")
	if files := gitOut(t, dir, "show", "--name-only", "--format=", "HEAD"); files != "work.txt" {
		t.Errorf("commit holds %q, want only work.txt", files)
	}

	// New upstream commits are fetched before the next job; the worktree
	// and its work are reused.
	if err := os.WriteFile(filepath.Join(remote, "new.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitOut(t, remote, "add", "new.txt")
	gitOut(t, remote, "commit", "-q", "-m", "upstream")
	again, err := prepareDir(ctx, ws, repo, "task-1", "")
	if err != nil || again != dir {
		t.Fatalf("second prepare: %s, %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "work.txt")); err != nil {
		t.Errorf("worktree was not reused: %v", err)
	}
	if got, want := gitOut(t, dir, "rev-parse", "origin/main"), gitOut(t, remote, "rev-parse", "HEAD"); got != want {
		t.Errorf("origin/main = %s, want the fetched %s", got, want)
	}

	// Cleanup removes the worktree and the local branch.
	if err := ws.Remove(ctx, "widgets", "task-1", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("worktree still there: %v", err)
	}
	gitDir, _ := ws.RepoDir("widgets")
	if out := gitOut(t, gitDir, "branch", "--list", "agent/task-1"); out != "" {
		t.Errorf("branch still there: %q", out)
	}
	if err := ws.Remove(ctx, "widgets", "task-1", 0); err != nil {
		t.Errorf("removing twice: %v", err)
	}
}

// A task whose branch was pushed starts from it; a pull request's task
// starts from its head branch.
func TestStartPoints(t *testing.T) {
	ws, repo, remote := setup(t)
	gitOut(t, remote, "checkout", "-q", "-b", "feature/x")
	gitOut(t, remote, "commit", "-q", "--allow-empty", "-m", "feature")
	feature := gitOut(t, remote, "rev-parse", "HEAD")
	gitOut(t, remote, "checkout", "-q", "-b", "agent/task-2")
	gitOut(t, remote, "commit", "-q", "--allow-empty", "-m", "pushed by the agent")
	pushed := gitOut(t, remote, "rev-parse", "HEAD")
	gitOut(t, remote, "checkout", "-q", "main")

	dir := mustPrepareDir(t, ws, repo, "pr-7", "feature/x")
	if got := gitOut(t, dir, "rev-parse", "HEAD"); got != feature {
		t.Errorf("pr-7 starts at %s, want feature/x %s", got, feature)
	}
	dir = mustPrepareDir(t, ws, repo, "task-2", "agent/task-2")
	if got := gitOut(t, dir, "rev-parse", "HEAD"); got != pushed {
		t.Errorf("task-2 starts at %s, want its pushed branch %s", got, pushed)
	}
}

// Lock files of a crashed git are removed at start, and a half-made
// worktree directory is made again.
func TestCleanStaleLocks(t *testing.T) {
	ctx := context.Background()
	ws, repo, _ := setup(t)
	dir := mustPrepareDir(t, ws, repo, "task-3", "")
	gitDir, _ := ws.RepoDir("widgets")
	locks := []string{
		filepath.Join(gitDir, "index.lock"),
		filepath.Join(gitDir, "worktrees", "task-3", "index.lock"),
		filepath.Join(gitDir, "refs", "heads", "agent", "task-3.lock"),
	}
	for _, l := range locks {
		if err := os.WriteFile(l, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// With its index locked, git refuses to work in the worktree.
	if err := exec.Command("git", "-C", dir, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x").Run(); err == nil {
		t.Fatal("commit with a stale index.lock succeeded; the test proves nothing")
	}
	removed, err := ws.Clean(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != len(locks) {
		t.Errorf("removed %v, want %v", removed, locks)
	}
	gitOut(t, dir, "commit", "-q", "--allow-empty", "-m", "after clean")

	// A worktree directory without its .git (a crash during add).
	broken, _ := ws.WorktreeDir("widgets", "task-4")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	if dir, err := prepareDir(ctx, ws, repo, "task-4", ""); err != nil || dir != broken {
		t.Fatalf("prepare over a broken dir: %s, %v", dir, err)
	}
}

// No task or project id reaches outside the workspace.
func TestNoEscape(t *testing.T) {
	ws := &workspace.Workspace{Root: t.TempDir()}
	for _, id := range []string{"../../etc", "..", "/abs/path", "a/../../b", ".", "x/y", "~root"} {
		dir, err := ws.WorktreeDir(id, id)
		if err != nil {
			t.Errorf("%q: %v", id, err)
			continue
		}
		rel, _ := filepath.Rel(filepath.Join(ws.Root, "worktrees"), dir)
		if strings.HasPrefix(rel, "..") || strings.Count(rel, string(filepath.Separator)) != 1 {
			t.Errorf("%q maps to %s, outside worktrees/<project>/<task>", id, dir)
		}
		if p := ws.LogPath(id, 1); !strings.HasPrefix(p, filepath.Join(ws.Root, "logs")+string(filepath.Separator)) {
			t.Errorf("log path of %q is %s", id, p)
		}
	}
}

func TestMissingDefaultBranch(t *testing.T) {
	ws, repo, _ := setup(t)
	repo.DefaultBranch = "trunk"
	if _, err := prepareDir(context.Background(), ws, repo, "t", ""); err == nil || !strings.Contains(err.Error(), "trunk") {
		t.Errorf("prepare without the default branch: %v", err)
	}
}

// gitRun is gitOut for goroutines other than the test's: it returns the
// error instead of failing the test.
func gitRun(dir string, args ...string) (string, error) {
	args = append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)
	out, err := exec.Command("git", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %v: %w: %s", args, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Concurrent jobs of one project share fetches, yet each sees what was
// pushed to the origin before it asked: every job pushes its task branch,
// then prepares, and its worktree must start from that very commit.
func TestConcurrentPreparesShareFetches(t *testing.T) {
	ctx := context.Background()
	ws, repo, remote := setup(t)
	mustPrepareDir(t, ws, repo, "warm", "")
	// Every fetch runs git-upload-pack in the origin: a wrapper counts
	// them, and is slow enough that the jobs pile up behind one.
	tmp := t.TempDir()
	count, wrapper := filepath.Join(tmp, "fetches"), filepath.Join(tmp, "upload-pack.sh")
	script := "#!/bin/sh\necho fetch >> " + count + "\nsleep 0.2\nexec git upload-pack \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	gitDir, err := ws.RepoDir(repo.Project)
	if err != nil {
		t.Fatal(err)
	}
	gitOut(t, gitDir, "config", "remote.origin.uploadpack", wrapper)

	const jobs = 8
	var (
		wg     sync.WaitGroup
		pushMu sync.Mutex // one writer of the origin at a time
	)
	for i := range jobs {
		wg.Go(func() {
			task := fmt.Sprint("task-", i)
			pushMu.Lock()
			sha, err := gitRun(remote, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", task)
			if err == nil {
				_, err = gitRun(remote, "update-ref", "refs/heads/"+workspace.Branch(task), sha)
			}
			pushMu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			dir, err := prepareDir(ctx, ws, repo, task, "")
			if err != nil {
				t.Error(err)
				return
			}
			if head, err := gitRun(dir, "rev-parse", "HEAD"); err != nil || head != sha {
				t.Errorf("%s: worktree at %s (%v), want the commit pushed before it asked, %s", task, head, err, sha)
			}
		})
	}
	wg.Wait()
	data, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(data), "fetch")
	t.Logf("%d jobs, %d fetches", jobs, n)
	if n < 1 || n > jobs/2 {
		t.Errorf("%d fetches for %d concurrent jobs, want far fewer", n, jobs)
	}
}
