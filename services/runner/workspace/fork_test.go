package workspace_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/orch-dev/orch/services/runner/workspace"
)

// forkPush commits file with text on the author's current branch and
// pushes it to origin only as the pull request ref Gitea keeps for a
// fork's pull request n (refs/pull/<n>/head), never as a branch.
func (o *origin) forkPush(n int, file, text string) string {
	o.t.Helper()
	write(o.t, filepath.Join(o.author, file), text)
	gitOut(o.t, o.author, "add", file)
	gitOut(o.t, o.author, "commit", "-q", "-m", "fork: change "+file)
	gitOut(o.t, o.author, "push", "-q", "--force", "origin", "HEAD:refs/pull/"+strconv.Itoa(n)+"/head")
	return gitOut(o.t, o.author, "rev-parse", "HEAD")
}

// A pull request from a fork: its head branch is not on origin, but
// Gitea keeps its head as refs/pull/<n>/head. The job runs at that head,
// on the task's own branch with no upstream, and the task file says a
// push cannot reach the fork; after the fork's author pushes again, the
// next job runs at the new head.
func TestForkPullRequestRunsAtItsHead(t *testing.T) {
	o, _ := newOrigin(t)
	gitOut(t, o.author, "checkout", "-q", "-b", "their-feature", "main")
	a := o.forkPush(7, "fork.txt", "A\n")
	ws, repo := o.setup()
	want := workspace.Want{Task: "pr-7", HeadBranch: "their-feature", HeadSHA: a, PR: 7}

	co := prepare(t, ws, repo, want)
	if co.Head != a || co.Target != a || co.Branch != "agent/pr-7" || co.Upstream != "" {
		t.Fatalf("fork PR: %+v, want at %s on agent/pr-7 with no upstream", co, a)
	}
	for _, w := range []string{"fork", "refs/pull/7/head", "cannot push"} {
		if !strings.Contains(notes(co), w) {
			t.Errorf("notes %q do not say %q", co.Notes, w)
		}
	}
	if out, err := exec.Command("git", "-C", co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}").CombinedOutput(); err == nil {
		t.Errorf("the worktree's branch tracks %s; a plain push must go nowhere", out)
	}

	// The fork's author pushes again; the event names the new head.
	b := o.forkPush(7, "fork.txt", "B\n")
	want.HeadSHA = b
	if co = prepare(t, ws, repo, want); co.Head != b || co.Branch != "agent/pr-7" {
		t.Fatalf("synchronized: %+v, want agent/pr-7 at %s", co, b)
	}
	// A job that names no head sha (a comment) runs at the newest head.
	c := o.forkPush(7, "fork.txt", "C\n")
	want.HeadSHA = ""
	if co = prepare(t, ws, repo, want); co.Head != c {
		t.Fatalf("comment: head %s, want %s", co.Head, c)
	}

	// The pull request is closed: its cleanup removes the worktree, the
	// task's branch and the fork's head fetched for it, which would
	// otherwise keep the fork's commits in the clone for good.
	gitDir, _ := ws.RepoDir("widgets")
	if err := ws.Remove(context.Background(), "widgets", "pr-7", 7); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", gitDir, "for-each-ref", "refs/orch/", "refs/heads/agent/").Output(); err != nil || len(out) != 0 {
		t.Errorf("refs left after cleanup (%v):\n%s", err, out)
	}
}

// A head branch that is not on origin, of a pull request whose ref origin
// does not have either (not Gitea, or the number is wrong): the job still
// runs, from the default branch, and the notes say it lacks the pull
// request's changes.
func TestForkPullRequestWithoutRef(t *testing.T) {
	o, _ := newOrigin(t)
	ws, repo := o.setup()
	main := o.head("main")
	co, err := ws.Prepare(context.Background(), repo, workspace.Want{Task: "pr-8", HeadBranch: "their-feature", PR: 8})
	if err != nil {
		t.Fatal(err)
	}
	if co.Head != main || !strings.Contains(notes(co), "could not be fetched") {
		t.Fatalf("missing pull ref: %+v, want at main %s with a note", co, main)
	}
}

// A fork's pull request whose branch has the name of a branch origin has
// (its main, or orch's own agent/<task>): the gateway says it is a fork's,
// and the job runs at the fork's head on the task's own branch, never on
// origin's branch of that name.
func TestForkPullRequestNamedLikeOriginsBranch(t *testing.T) {
	for i, name := range []string{"main", "agent/wid-41"} {
		t.Run(name, func(t *testing.T) {
			o, _ := newOrigin(t)
			gitOut(t, o.author, "push", "-q", "origin", "main:refs/heads/agent/wid-41")
			n := 20 + i
			gitOut(t, o.author, "checkout", "-q", "-b", "fork-work", "main")
			head := o.forkPush(n, "fork.txt", "mallory\n")
			ws, repo := o.setup()
			task := "pr-" + strconv.Itoa(n)
			co := prepare(t, ws, repo, workspace.Want{Task: task, HeadBranch: name, HeadSHA: head, PR: n, Fork: true})
			if co.Head != head || co.Branch != "agent/"+task || co.Upstream != "" {
				t.Fatalf("fork PR on %q: %+v, want at the fork's head %s on agent/%s with no upstream", name, co, head, task)
			}
		})
	}
}
