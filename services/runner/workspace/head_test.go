package workspace_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/services/runner/workspace"
)

// origin is a test's remote: a bare repository, pushed to from a clone of
// its own, as a pull request's author would.
type origin struct {
	t      *testing.T
	bare   string
	author string // the author's clone
}

// newOrigin makes a bare origin with main and a feature branch one commit
// ahead, and returns it with the feature branch's head.
func newOrigin(t *testing.T) (*origin, string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	o := &origin{t: t, bare: filepath.Join(dir, "origin.git"), author: filepath.Join(dir, "author")}
	if err := workspace.CreateRepo(ctx, o.author, "main", map[string]string{"README.md": "hello\n"}); err != nil {
		t.Fatal(err)
	}
	gitOut(t, dir, "init", "-q", "--bare", o.bare)
	gitOut(t, o.author, "remote", "add", "origin", o.bare)
	gitOut(t, o.author, "push", "-q", "origin", "main")
	gitOut(t, o.author, "checkout", "-q", "-b", "feature/x")
	return o, o.commit("feature.txt", "A\n")
}

// commit commits file with text on the author's current branch, pushes it
// and returns the commit.
func (o *origin) commit(file, text string) string {
	o.t.Helper()
	if err := os.WriteFile(filepath.Join(o.author, file), []byte(text), 0o644); err != nil {
		o.t.Fatal(err)
	}
	gitOut(o.t, o.author, "add", file)
	gitOut(o.t, o.author, "commit", "-q", "-m", "change "+file)
	gitOut(o.t, o.author, "push", "-q", "--force", "-u", "origin", "HEAD")
	return gitOut(o.t, o.author, "rev-parse", "HEAD")
}

func (o *origin) head(branch string) string {
	o.t.Helper()
	return gitOut(o.t, o.bare, "rev-parse", "refs/heads/"+branch)
}

func (o *origin) setup() (*workspace.Workspace, workspace.Repo) {
	return &workspace.Workspace{Root: o.t.TempDir()}, workspace.Repo{Project: "widgets", CloneURL: o.bare, DefaultBranch: "main"}
}

// onPR7 is where most head tests start: an origin whose pull request 7
// has branch feature/x at its first commit, a workspace, and the want of
// a job of that pull request at that commit.
func onPR7(t *testing.T) (*origin, *workspace.Workspace, workspace.Repo, workspace.Want) {
	t.Helper()
	o, a := newOrigin(t)
	ws, repo := o.setup()
	return o, ws, repo, workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a}
}

func prepare(t *testing.T, ws *workspace.Workspace, repo workspace.Repo, want workspace.Want) workspace.Checkout {
	t.Helper()
	co, err := ws.Prepare(context.Background(), repo, want)
	if err != nil {
		t.Fatal(err)
	}
	if got := gitOut(t, co.Dir, "rev-parse", "HEAD"); got != co.Head {
		t.Fatalf("checkout says head %s, the worktree is at %s", co.Head, got)
	}
	return co
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func notes(co workspace.Checkout) string { return strings.Join(co.Notes, "\n") }

// Each job of a pull request runs at its head: at A when it opens, at B
// after the author pushed B, at the rewritten head after a force push, and
// at the newest head when the job names an older one.
func TestEveryJobAtThePRHead(t *testing.T) {
	o, ws, repo, want := onPR7(t)
	a := want.HeadSHA

	co := prepare(t, ws, repo, want)
	if co.Head != a || co.Target != a || co.Branch != "feature/x" || co.Upstream != "origin/feature/x" || len(co.Notes) != 0 {
		t.Fatalf("opened: %+v, want at %s on feature/x tracking origin/feature/x, no notes", co, a)
	}

	b := o.commit("feature.txt", "B\n")
	want.HeadSHA = b
	if co = prepare(t, ws, repo, want); co.Head != b || len(co.Notes) != 0 {
		t.Fatalf("synchronized: head %s, notes %q; want %s", co.Head, co.Notes, b)
	}

	// A job made by an older event (a comment on A) runs at the newer head.
	c := o.commit("other.txt", "C\n")
	want.HeadSHA = a
	if co = prepare(t, ws, repo, want); co.Head != c || !strings.Contains(notes(co), "moved on") {
		t.Fatalf("older event: head %s, notes %q; want %s and a note", co.Head, co.Notes, c)
	}

	// The author rewrites the branch: nothing in the worktree is its own,
	// so it follows.
	gitOut(t, o.author, "reset", "-q", "--hard", a)
	d := o.commit("rewritten.txt", "D\n")
	want.HeadSHA = d
	if co = prepare(t, ws, repo, want); co.Head != d || len(co.Notes) != 0 {
		t.Fatalf("force push: head %s, notes %q; want %s", co.Head, co.Notes, d)
	}

	// A job that names no head branch (a comment on the pull request
	// without one) stays on the branch and follows it too.
	e := o.commit("more.txt", "E\n")
	if co = prepare(t, ws, repo, workspace.Want{Task: "pr-7"}); co.Head != e || co.Branch != "feature/x" {
		t.Fatalf("job without a head branch: %+v, want feature/x at %s", co, e)
	}
}

// Commits an earlier job made and did not push, and its uncommitted
// changes, survive a later job and are named in its notes.
func TestLocalWorkKept(t *testing.T) {
	o, ws, repo, want := onPR7(t)
	dir := prepare(t, ws, repo, want).Dir

	// The agent commits without pushing and leaves changes behind.
	write(t, filepath.Join(dir, "agent.txt"), "agent's work\n")
	gitOut(t, dir, "add", "agent.txt")
	gitOut(t, dir, "commit", "-q", "-m", "agent's commit")
	mine := gitOut(t, dir, "rev-parse", "HEAD")
	write(t, filepath.Join(dir, "README.md"), "edited, not committed\n")
	write(t, filepath.Join(dir, "scratch.txt"), "untracked\n")

	b := o.commit("feature.txt", "B\n")
	want.HeadSHA = b
	co := prepare(t, ws, repo, want)
	if co.Head != mine || co.Target != b || co.Unpushed != 1 {
		t.Fatalf("head %s target %s unpushed %d; want the kept %s, target %s, 1 unpushed", co.Head, co.Target, co.Unpushed, mine, b)
	}
	for _, w := range []string{b[:12], mine[:12], "1 commit(s) that are not on the remote", "README.md", "scratch.txt"} {
		if !strings.Contains(notes(co), w) {
			t.Errorf("notes lack %q:\n%s", w, notes(co))
		}
	}
	for file, text := range map[string]string{"agent.txt": "agent's work\n", "README.md": "edited, not committed\n", "scratch.txt": "untracked\n"} {
		if got, err := os.ReadFile(filepath.Join(dir, file)); err != nil || string(got) != text {
			t.Errorf("%s = %q, %v; want %q kept", file, got, err, text)
		}
	}

	// Once the agent pushes its work, the worktree follows the remote again.
	gitOut(t, dir, "checkout", "-q", "--", "README.md")
	if err := os.Remove(filepath.Join(dir, "scratch.txt")); err != nil {
		t.Fatal(err)
	}
	gitOut(t, dir, "pull", "-q", "--rebase")
	gitOut(t, dir, "push", "-q")
	gitOut(t, o.author, "pull", "-q", "--rebase")
	c := o.commit("other.txt", "C\n")
	want.HeadSHA = c
	if co = prepare(t, ws, repo, want); co.Head != c || len(co.Notes) != 0 {
		t.Fatalf("after the push: head %s, notes %q; want %s", co.Head, co.Notes, c)
	}
}

// Uncommitted changes ride along a fast-forward when nothing is in their
// way, and keep the worktree where it is when the new head changes the
// same file.
func TestUncommittedChanges(t *testing.T) {
	o, ws, repo, want := onPR7(t)
	dir := prepare(t, ws, repo, want).Dir
	write(t, filepath.Join(dir, "README.md"), "local edit\n")

	b := o.commit("feature.txt", "B\n")
	want.HeadSHA = b
	co := prepare(t, ws, repo, want)
	if co.Head != b || !strings.Contains(notes(co), "README.md") {
		t.Fatalf("head %s notes %q; want %s with the edit named", co.Head, co.Notes, b)
	}

	c := o.commit("README.md", "the author's edit\n")
	want.HeadSHA = c
	co = prepare(t, ws, repo, want)
	if co.Head != b || !strings.Contains(notes(co), "in the way") {
		t.Fatalf("head %s notes %q; want it kept at %s with a note", co.Head, co.Notes, b)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "README.md")); string(got) != "local edit\n" {
		t.Errorf("README.md = %q, the uncommitted edit was lost", got)
	}
}

// For a pull request from a branch that is not an agent branch, the
// worktree tracks that branch: a plain `git push` updates the pull
// request, and no branch is made beside it. Cleanup removes the local
// copy of the branch only.
func TestPushUpdatesThePRBranch(t *testing.T) {
	o, ws, repo, want := onPR7(t)
	co := prepare(t, ws, repo, want)
	if up := gitOut(t, co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); up != "origin/feature/x" {
		t.Errorf("upstream %s, want origin/feature/x", up)
	}
	write(t, filepath.Join(co.Dir, "fix.txt"), "fixed\n")
	gitOut(t, co.Dir, "add", "fix.txt")
	gitOut(t, co.Dir, "commit", "-q", "-m", "fix")
	gitOut(t, co.Dir, "push", "-q")
	if got, want := o.head("feature/x"), gitOut(t, co.Dir, "rev-parse", "HEAD"); got != want {
		t.Errorf("origin's feature/x at %s, want the pushed %s", got, want)
	}
	if branches := gitOut(t, o.bare, "branch", "--list"); strings.Contains(branches, "agent/") {
		t.Errorf("a branch was made beside the pull request's: %s", branches)
	}

	if err := ws.Remove(context.Background(), "widgets", "pr-7", 7); err != nil {
		t.Fatal(err)
	}
	gitDir, _ := ws.RepoDir("widgets")
	if out := gitOut(t, gitDir, "branch", "--list", "feature/x"); out != "" {
		t.Errorf("local feature/x still there after cleanup: %q", out)
	}
	if o.head("feature/x") == "" {
		t.Error("cleanup touched the remote branch")
	}
}

// Agent branches work as before, and follow their remote head; a
// worktree made on agent/pr-<n> moves to the pull request's head branch
// when it holds nothing of its own.
func TestAgentBranchesAndMoving(t *testing.T) {
	o, _ := newOrigin(t)
	ws, repo := o.setup()
	gitOut(t, o.author, "checkout", "-q", "-b", "agent/wid-41", "main")
	a := o.commit("agent.txt", "A\n")
	co := prepare(t, ws, repo, workspace.Want{Task: "wid-41", HeadBranch: "agent/wid-41", HeadSHA: a})
	if co.Branch != "agent/wid-41" || co.Head != a || co.Upstream != "origin/agent/wid-41" {
		t.Fatalf("agent branch: %+v", co)
	}
	b := o.commit("agent.txt", "B\n")
	if co = prepare(t, ws, repo, workspace.Want{Task: "wid-41", HeadBranch: "agent/wid-41", HeadSHA: b}); co.Head != b {
		t.Fatalf("agent branch after a push: head %s, want %s", co.Head, b)
	}

	// A task without a pull request: agent/<task> from the default branch.
	co = prepare(t, ws, repo, workspace.Want{Task: "plane-1"})
	if co.Branch != "agent/plane-1" || co.Head != o.head("main") || co.Upstream != "" || len(co.Notes) != 0 {
		t.Fatalf("new task: %+v", co)
	}

	// A worktree on agent/pr-9 (a job that named no head branch) moves to
	// the head branch once a job names it.
	gitOut(t, o.author, "checkout", "-q", "feature/x")
	feature := o.head("feature/x")
	if co = prepare(t, ws, repo, workspace.Want{Task: "pr-9"}); co.Branch != "agent/pr-9" {
		t.Fatalf("pr-9 without a head branch: %+v", co)
	}
	if co = prepare(t, ws, repo, workspace.Want{Task: "pr-9", HeadBranch: "feature/x", HeadSHA: feature}); co.Branch != "feature/x" || co.Head != feature {
		t.Fatalf("pr-9 with its head branch: %+v, want feature/x at %s", co, feature)
	}
}

// Two pull requests from one branch: git checks a branch out in one
// worktree only, so the second task's worktree is on agent/<task>,
// follows the head branch all the same, and its notes say how to push.
func TestTwoPRsFromOneBranch(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	prepare(t, ws, repo, workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a})
	co := prepare(t, ws, repo, workspace.Want{Task: "pr-8", HeadBranch: "feature/x", HeadSHA: a})
	if co.Branch != "agent/pr-8" || co.Head != a || co.Upstream != "" || !strings.Contains(notes(co), "git push origin HEAD:feature/x") {
		t.Fatalf("second pull request: %+v", co)
	}
	b := o.commit("feature.txt", "B\n")
	if co = prepare(t, ws, repo, workspace.Want{Task: "pr-8", HeadBranch: "feature/x", HeadSHA: b}); co.Head != b || co.Branch != "agent/pr-8" {
		t.Fatalf("second pull request after a push: %+v, want at %s", co, b)
	}
}
