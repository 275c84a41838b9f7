package workspace_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/services/runner/workspace"
)

// A new task whose branch starts at the default branch's head takes the
// spare worktree without running git; git then sees the worktree as it
// would one "worktree add" made: on the task's branch, clean, listed at
// its place, tracking origin's branch when the task's branch is there,
// and a commit in it moves the branch. A spare the remote left behind is
// not taken, and is made again at the new head.
func TestSpareBecomesANewTask(t *testing.T) {
	ctx := context.Background()
	o, _ := newOrigin(t)
	ws, repo := o.setup()
	before := time.Now() // the new tasks' events, which the first job's fetch follows
	prepare(t, ws, repo, workspace.Want{Task: "wid-1", Since: time.Now()})
	spareDir := filepath.Join(ws.Root, "spares", "widgets")
	for i, want := range []bool{true, false} { // made, then there already
		made, err := ws.MakeSpare(ctx, repo)
		if err != nil {
			t.Fatal(err)
		}
		if dir, ok := ws.Spare("widgets"); made != want || !ok || dir != spareDir {
			t.Fatalf("MakeSpare #%d: made %v (want %v); Spare says %q %v, want %s", i+1, made, want, dir, ok, spareDir)
		}
	}
	main := o.head("main")
	if got := gitOut(t, spareDir, "rev-parse", "HEAD"); got != main {
		t.Fatalf("spare at %s, want main's head %s", got, main)
	}

	co, ran := gitCalls(t, func() (workspace.Checkout, error) {
		return ws.Prepare(ctx, repo, workspace.Want{Task: "wid-2", Since: before})
	})
	if len(ran) != 0 {
		t.Errorf("the new task ran git:\n%s", strings.Join(ran, "\n"))
	}
	if co.Head != main || co.Branch != "agent/wid-2" || co.Unpushed != 0 || len(co.Notes) != 0 || co.Made != workspace.MadeFromSpare {
		t.Fatalf("new task: %+v, want agent/wid-2 at main %s made from the spare, and no notes", co, main)
	}
	if _, err := os.Stat(spareDir); !os.IsNotExist(err) {
		t.Errorf("the spare is still there after it was taken: %v", err)
	}
	if dir, ok := ws.Spare("widgets"); ok {
		t.Errorf("Spare says %s after the spare was taken", dir)
	}
	clone, _ := ws.RepoDir("widgets")
	if got := gitOut(t, co.Dir, "symbolic-ref", "HEAD"); got != "refs/heads/agent/wid-2" {
		t.Errorf("HEAD is %s", got)
	}
	if st := gitOut(t, co.Dir, "status", "--porcelain"); st != "" {
		t.Errorf("status of the taken spare: %q", st)
	}
	if list := gitOut(t, clone, "worktree", "list", "--porcelain"); !strings.Contains(list, "worktree "+co.Dir+"\n") || !strings.Contains(list, "branch refs/heads/agent/wid-2") {
		t.Errorf("git worktree list does not show the task's worktree:\n%s", list)
	}
	if pruned := gitOut(t, clone, "worktree", "prune", "--dry-run", "--verbose"); pruned != "" {
		t.Errorf("git would prune: %s", pruned)
	}
	write(t, filepath.Join(co.Dir, "work.txt"), "work\n")
	gitOut(t, co.Dir, "add", "work.txt")
	gitOut(t, co.Dir, "commit", "-q", "-m", "work")
	if b, h := gitOut(t, clone, "rev-parse", "refs/heads/agent/wid-2"), gitOut(t, co.Dir, "rev-parse", "HEAD"); b != h || h == main {
		t.Errorf("after a commit the branch is at %s, HEAD at %s", b, h)
	}

	// A task whose branch origin has (at main's head) tracks it.
	gitOut(t, o.author, "push", "-q", "origin", main+":refs/heads/agent/wid-3")
	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	co = prepare(t, ws, repo, workspace.Want{Task: "wid-3", HeadBranch: "agent/wid-3", HeadSHA: main, Since: time.Now()})
	if _, err := os.Stat(spareDir); !os.IsNotExist(err) {
		t.Errorf("the spare was not taken for a task at main's head: %v", err)
	}
	if up := gitOut(t, co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); up != "origin/agent/wid-3" || co.Upstream != up {
		t.Errorf("upstream %q (checkout says %q), want origin/agent/wid-3", up, co.Upstream)
	}

	// The remote moves on: the spare made before is not taken, and the
	// next one is at the new head.
	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	gitOut(t, o.author, "checkout", "-q", "main")
	newMain := o.commit("next.txt", "next\n")
	co, ran = gitCalls(t, func() (workspace.Checkout, error) {
		return ws.Prepare(ctx, repo, workspace.Want{Task: "wid-4", Since: time.Now()})
	})
	if co.Head != newMain || co.Made != workspace.MadeByAdd || !strings.Contains(strings.Join(ran, "\n"), "git read-tree") {
		t.Errorf("new task after the remote moved: head %s (want %s), git ran:\n%s", co.Head, newMain, strings.Join(ran, "\n"))
	}
	if got := gitOut(t, spareDir, "rev-parse", "HEAD"); got != main {
		t.Errorf("the stale spare moved to %s", got)
	}
	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if got := gitOut(t, spareDir, "rev-parse", "HEAD"); got != newMain {
		t.Errorf("spare made again at %s, want %s", got, newMain)
	}
	if pruned := gitOut(t, clone, "worktree", "prune", "--dry-run", "--verbose"); pruned != "" {
		t.Errorf("git would prune: %s", pruned)
	}
}

// A sparse project's spare is sparse too, and one made with other
// directories than the registry now names is not taken. Clean, at a
// runner's start, removes a spare a crash left.
func TestSpareSparseAndCleaned(t *testing.T) {
	ctx := context.Background()
	remote := filepath.Join(t.TempDir(), "remote")
	if err := workspace.CreateRepo(ctx, remote, "main", map[string]string{"README.md": "hello\n", "api/main.go": "package main\n", "web/app.js": "app\n"}); err != nil {
		t.Fatal(err)
	}
	ws := &workspace.Workspace{Root: t.TempDir()}
	repo := workspace.Repo{Project: "mono", CloneURL: remote, DefaultBranch: "main", Sparse: []string{"api"}}
	prepare(t, ws, repo, workspace.Want{Task: "wid-1"})
	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	co, ran := gitCalls(t, func() (workspace.Checkout, error) { return ws.Prepare(ctx, repo, workspace.Want{Task: "wid-2"}) })
	if strings.Contains(strings.Join(ran, "\n"), "worktree add") {
		t.Errorf("the sparse spare was not taken:\n%s", strings.Join(ran, "\n"))
	}
	for file, there := range map[string]bool{"README.md": true, "api/main.go": true, "web/app.js": false} {
		if _, err := os.Stat(filepath.Join(co.Dir, file)); (err == nil) != there {
			t.Errorf("%s in the worktree: %v, want %v", file, err == nil, there)
		}
	}
	if st := gitOut(t, co.Dir, "status", "--porcelain"); st != "" {
		t.Errorf("status: %q", st)
	}

	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	repo.Sparse = []string{"web"}
	co, ran = gitCalls(t, func() (workspace.Checkout, error) { return ws.Prepare(ctx, repo, workspace.Want{Task: "wid-3"}) })
	if !strings.Contains(strings.Join(ran, "\n"), "worktree add") {
		t.Errorf("a spare of other directories was taken:\n%s", strings.Join(ran, "\n"))
	}
	if _, err := os.Stat(filepath.Join(co.Dir, "web", "app.js")); err != nil {
		t.Errorf("the new task's worktree lacks web/: %v", err)
	}

	if _, err := ws.Clean(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ws.Root, "spares")); !os.IsNotExist(err) {
		t.Errorf("Clean left the spares: %v", err)
	}
	clone, _ := ws.RepoDir("mono")
	if list := gitOut(t, clone, "worktree", "list", "--porcelain"); strings.Contains(list, "spares") {
		t.Errorf("a removed spare is still listed:\n%s", list)
	}
}

// A project whose registry entry says spare_worktree: false keeps none:
// the spare made before is removed (from git's list too), and a new task
// adds its worktree.
func TestNoSpare(t *testing.T) {
	ctx := context.Background()
	_, ws, repo := withSpare(t)
	spareDir := filepath.Join(ws.Root, "spares", "widgets")
	if _, err := os.Stat(spareDir); err != nil {
		t.Fatalf("no spare made: %v", err)
	}

	repo.NoSpare = true
	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spareDir); !os.IsNotExist(err) {
		t.Errorf("the spare is still there with spare_worktree false: %v", err)
	}
	clone, _ := ws.RepoDir("widgets")
	if list := gitOut(t, clone, "worktree", "list", "--porcelain"); strings.Contains(list, spareDir) {
		t.Errorf("git still lists the spare:\n%s", list)
	}
	co := prepare(t, ws, repo, workspace.Want{Task: "wid-2", Since: time.Now()})
	if co.Made != workspace.MadeByAdd {
		t.Errorf("new task made by %q, want %q", co.Made, workspace.MadeByAdd)
	}
}

// A take that fails part way (here the branch's ref, which a stale lock
// of git's holds) undoes what its other writes did, the branch's
// upstream in the clone's config too: the spare is back where it was,
// git would prune nothing, and once the spare is made ready again the
// next try takes it and tracks the branch once.
func TestSpareTakeUndone(t *testing.T) {
	ctx := context.Background()
	o, ws, repo := withSpare(t)
	main := o.head("main")
	gitOut(t, o.author, "push", "-q", "origin", main+":refs/heads/agent/wid-5")
	clone, _ := ws.RepoDir("widgets")
	stale := filepath.Join(clone, "refs", "heads", "agent", "wid-5.lock")
	write(t, stale, "")
	want := workspace.Want{Task: "wid-5", HeadBranch: "agent/wid-5", HeadSHA: main, Since: time.Now()}
	if co, err := ws.Prepare(ctx, repo, want); err == nil {
		t.Fatalf("prepared %+v with the branch's ref locked", co)
	}
	section := `[branch "agent/wid-5"]`
	if cfg, _ := os.ReadFile(filepath.Join(clone, "config")); strings.Contains(string(cfg), section) {
		t.Errorf("the undone take left its upstream in the clone's config:\n%s", cfg)
	}
	spareDir := filepath.Join(ws.Root, "spares", "widgets")
	if got := gitOut(t, spareDir, "rev-parse", "HEAD"); got != main {
		t.Errorf("the spare is at %s after the undone take, want %s", got, main)
	}
	if pruned := gitOut(t, clone, "worktree", "prune", "--dry-run", "--verbose"); pruned != "" {
		t.Errorf("git would prune: %s", pruned)
	}

	if err := os.Remove(stale); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.MakeSpare(ctx, repo); err != nil {
		t.Fatal(err)
	}
	co := prepare(t, ws, repo, want)
	if co.Made != workspace.MadeFromSpare {
		t.Errorf("made %q the second time, want from the spare", co.Made)
	}
	if up := gitOut(t, co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); up != "origin/agent/wid-5" {
		t.Errorf("upstream %q, want origin/agent/wid-5", up)
	}
	if cfg, _ := os.ReadFile(filepath.Join(clone, "config")); strings.Count(string(cfg), section) != 1 {
		t.Errorf("the clone's config has the branch's section %d times, want once:\n%s", strings.Count(string(cfg), section), cfg)
	}
}

// withSpare is an origin and a workspace whose project has had a task
// (wid-1) and has its spare worktree ready.
func withSpare(t *testing.T) (*origin, *workspace.Workspace, workspace.Repo) {
	t.Helper()
	o, _ := newOrigin(t)
	ws, repo := o.setup()
	prepare(t, ws, repo, workspace.Want{Task: "wid-1", Since: time.Now()})
	if _, err := ws.MakeSpare(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	return o, ws, repo
}
