package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// A job whose head the clone already has at origin/<head branch> runs
// without a fetch, in a worktree left as it is: its uncommitted changes
// are kept and named. A job whose head the clone lacks fetches it, and one
// in a worktree that holds a commit of its own reports it.
func TestJobAtAKnownHeadSkipsTheFetch(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	gitDir, _ := ws.RepoDir("widgets")
	want := workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a, Since: time.Now()}
	dir := prepare(t, ws, repo, want).Dir

	write(t, filepath.Join(dir, "README.md"), "local edit\n")
	write(t, filepath.Join(dir, "scratch.txt"), "untracked\n")
	b := o.commit("feature.txt", "B\n")

	// The event of this job named a, when the remote had it: the clone
	// has it, so no fetch (the remote's b is not seen yet).
	want.Since = time.Now()
	co := prepare(t, ws, repo, want)
	if co.Head != a || co.Target != a || co.Upstream != "origin/feature/x" {
		t.Fatalf("job at the known head: %+v, want at %s tracking origin/feature/x", co, a)
	}
	if got := gitOut(t, gitDir, "rev-parse", "refs/remotes/origin/feature/x"); got != a {
		t.Errorf("origin/feature/x in the clone at %s, want %s: the job fetched", got, a)
	}
	for _, w := range []string{"README.md", "scratch.txt"} {
		if !strings.Contains(notes(co), w) {
			t.Errorf("notes lack the uncommitted %s:\n%s", w, notes(co))
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "README.md")); string(got) != "local edit\n" {
		t.Errorf("README.md = %q, the uncommitted edit was lost", got)
	}

	// The next event names b, which the clone lacks: fetched, and the
	// worktree moves to it with the edits.
	want.HeadSHA, want.Since = b, time.Now()
	if co = prepare(t, ws, repo, want); co.Head != b || !strings.Contains(notes(co), "README.md") {
		t.Fatalf("job at a new head: head %s, notes %q; want %s with the edit named", co.Head, co.Notes, b)
	}

	// The agent commits without pushing: the head moved away from the
	// target, and the commit is reported, not lost.
	gitOut(t, dir, "add", "README.md", "scratch.txt")
	gitOut(t, dir, "commit", "-q", "-m", "agent's commit")
	mine := gitOut(t, dir, "rev-parse", "HEAD")
	want.Since = time.Now()
	co = prepare(t, ws, repo, want)
	if co.Head != mine || co.Target != b || co.Unpushed != 1 || !strings.Contains(notes(co), "1 commit(s)") {
		t.Fatalf("job after an unpushed commit: head %s target %s unpushed %d notes %q; want %s, %s, 1",
			co.Head, co.Target, co.Unpushed, co.Notes, mine, b)
	}
}

// A retry, or a job that names no head, fetches even when the clone has
// the head: it asks for the remote as it is now.
func TestJobWithoutEventTimeFetches(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	want := workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a, Since: time.Now()}
	prepare(t, ws, repo, want)
	b := o.commit("feature.txt", "B\n")
	want.Since = time.Time{}
	if co := prepare(t, ws, repo, want); co.Head != b || !strings.Contains(notes(co), "moved on") {
		t.Fatalf("retry: head %s notes %q, want the remote's %s and a note", co.Head, co.Notes, b)
	}
}

// A new worktree is made in one step, and what the later jobs read of it
// is what git reads: its upstream, its base and a clean status. With the
// clone's refs packed, jobs at a known head still skip the fetch and
// land where git says.
func TestNewWorktreeAndPackedRefs(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	gitDir, _ := ws.RepoDir("widgets")
	want := workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a, Since: time.Now()}
	co := prepare(t, ws, repo, want)
	if up := gitOut(t, co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); up != "origin/feature/x" {
		t.Errorf("upstream %s, want origin/feature/x", up)
	}
	if base := gitOut(t, co.Dir, "rev-parse", "refs/worktree/orch/base"); base != a {
		t.Errorf("git reads the base ref as %s, want %s", base, a)
	}
	if st := gitOut(t, co.Dir, "status", "--porcelain"); st != "" {
		t.Errorf("new worktree not clean: %q", st)
	}

	gitOut(t, gitDir, "pack-refs", "--all", "--prune")
	if _, err := os.Stat(filepath.Join(gitDir, "refs", "remotes", "origin", "feature", "x")); err == nil {
		t.Fatal("pack-refs left the loose ref")
	}
	b := o.commit("feature.txt", "B\n")
	want.Since = time.Now()
	if co = prepare(t, ws, repo, want); co.Head != a || len(co.Notes) != 0 {
		t.Fatalf("packed refs, known head: head %s notes %q, want %s and no notes", co.Head, co.Notes, a)
	}
	want.HeadSHA, want.Since = b, time.Now()
	if co = prepare(t, ws, repo, want); co.Head != b || len(co.Notes) != 0 {
		t.Fatalf("packed refs, new head: head %s notes %q, want %s", co.Head, co.Notes, b)
	}
	if base := gitOut(t, co.Dir, "rev-parse", "refs/worktree/orch/base"); base != b {
		t.Errorf("git reads the base ref as %s, want %s", base, b)
	}
}

// A job of a pull request from a person's branch, in a worktree already at
// its head, starts without running git at all: the branch name, the
// worktree that holds the branch, the refs and a clean status are read
// in-process. A new task with no branch on the remote (a work item's
// first job) runs one, the new worktree's checkout (handmade.go). (Each
// git process costs milliseconds before the agent starts.)
func TestGitProcessesOfAJob(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	before := time.Now() // the new task's event, which the first job's fetch follows
	want := workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a, PR: 7, Since: time.Now()}
	prepare(t, ws, repo, want)

	want.Since = time.Now()
	co, ran := gitCalls(t, func() (workspace.Checkout, error) { return ws.Prepare(context.Background(), repo, want) })
	if co.Head != a || co.Branch != "feature/x" || len(co.Notes) != 0 {
		t.Fatalf("second job: %+v, want feature/x at %s and no notes", co, a)
	}
	if len(ran) != 0 {
		t.Errorf("the job in its worktree ran git:\n%s", strings.Join(ran, "\n"))
	}

	main := o.head("main")
	co, ran = gitCalls(t, func() (workspace.Checkout, error) {
		return ws.Prepare(context.Background(), repo, workspace.Want{Task: "wid-41", Since: before})
	})
	if co.Head != main || co.Branch != "agent/wid-41" || co.Unpushed != 0 || len(co.Notes) != 0 {
		t.Fatalf("new task: %+v, want agent/wid-41 at main %s and no notes", co, main)
	}
	if len(ran) != 1 || ran[0] != "git read-tree --reset -u HEAD" {
		t.Errorf("the new task ran git %d times, want once (the checkout):\n%s", len(ran), strings.Join(ran, "\n"))
	}
}

// gitCalls runs prepare with a git on PATH that notes each of its runs,
// and returns what prepare returned and the git command lines.
func gitCalls(t *testing.T, prepare func() (workspace.Checkout, error)) (workspace.Checkout, []string) {
	t.Helper()
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	bin, calls := t.TempDir(), filepath.Join(t.TempDir(), "calls")
	wrapper := fmt.Sprintf("#!/bin/sh\necho \"git $*\" >> %q\nexec %q \"$@\"\n", calls, real)
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	co, err := prepare()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(calls)
	if errors.Is(err, os.ErrNotExist) {
		return co, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return co, strings.Split(strings.TrimSpace(string(data)), "\n")
}

// Pristine finds, without git, a worktree that holds nothing of its own:
// at the remote head of its branch or of the default branch, and clean.
// Anything of its own (an edit, an untracked file, a commit no remote
// has) makes it say no, and git is asked.
func TestPristine(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	review := prepare(t, ws, repo, workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a, PR: 7, Since: time.Now()})
	fresh := prepare(t, ws, repo, workspace.Want{Task: "wid-41", Since: time.Now()})
	main := o.head("main")

	for _, c := range []struct {
		dir, head, branch string
	}{{review.Dir, a, "feature/x"}, {fresh.Dir, main, "agent/wid-41"}} {
		head, branch, ok := ws.Pristine("widgets", c.dir, "main")
		if !ok || head != c.head || branch != c.branch {
			t.Errorf("Pristine(%s) = %s, %q, %v; want %s, %q, true", filepath.Base(c.dir), head, branch, ok, c.head, c.branch)
		}
	}
	if _, _, ok := ws.Pristine("widgets", fresh.Dir, "elsewhere"); ok {
		t.Error("a new task's worktree found pristine without its default branch's remote head")
	}

	dir := fresh.Dir
	write(t, filepath.Join(dir, "scratch.txt"), "untracked\n")
	if _, _, ok := ws.Pristine("widgets", dir, "main"); ok {
		t.Error("a worktree with an untracked file found pristine")
	}
	gitOut(t, dir, "add", "scratch.txt")
	if _, _, ok := ws.Pristine("widgets", dir, "main"); ok {
		t.Error("a worktree with a staged file found pristine")
	}
	gitOut(t, dir, "commit", "-q", "-m", "agent's commit")
	if _, _, ok := ws.Pristine("widgets", dir, "main"); ok {
		t.Error("a worktree with a commit no remote has found pristine")
	}
	write(t, filepath.Join(review.Dir, "README.md"), "local edit\n")
	if _, _, ok := ws.Pristine("widgets", review.Dir, "main"); ok {
		t.Error("a worktree with an edit found pristine")
	}
}

// The shared fetch of origin does not hold back the jobs of the project
// that need none: while one job's fetch hangs (a slow remote), a job at a
// known head in its worktree, and one that is made a new worktree from
// what the clone has, are prepared; the fetching job ends once the fetch
// does. (On the old code both waited for the clone's lock, which the
// fetch held while git ran.)
func TestSlowFetchHoldsBackNoOtherJob(t *testing.T) {
	o, a := newOrigin(t)
	ws, repo := o.setup()
	review := workspace.Want{Task: "pr-7", HeadBranch: "feature/x", HeadSHA: a, PR: 7, Since: time.Now()}
	prepare(t, ws, repo, review)
	other := workspace.Want{Task: "pr-8", HeadBranch: "feature/x", HeadSHA: a, PR: 8, Since: time.Now()}

	// git fetches wait while the gate exists, after saying they started.
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	bin, dir := t.TempDir(), t.TempDir()
	gate, started := filepath.Join(dir, "gate"), filepath.Join(dir, "started")
	wrapper := fmt.Sprintf(`#!/bin/sh
case " $* " in *" fetch "*) touch %q; while [ -e %q ]; do sleep 0.01; done;; esac
exec %q "$@"
`, started, gate, real)
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	opened := false
	open := func() {
		if !opened {
			opened = true
			_ = os.Remove(gate)
		}
	}
	defer open()
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	fetching := make(chan error, 1)
	go func() {
		_, err := ws.Prepare(context.Background(), repo, workspace.Want{Task: "wid-41", Since: time.Now()})
		fetching <- err
	}()
	natstest.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
		_, err := os.Stat(started)
		return err
	})

	deadline := time.After(time.Minute)
	for _, want := range []workspace.Want{review, other} {
		done := make(chan error, 1)
		go func() {
			_, err := ws.Prepare(context.Background(), repo, want)
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", want.Task, err)
			}
		case <-deadline:
			open()
			<-done
			t.Fatalf("%s was not prepared while another job's fetch ran", want.Task)
		}
	}
	select {
	case err := <-fetching:
		t.Fatalf("the fetching job ended before its fetch could: %v", err)
	default:
	}
	open()
	if err := <-fetching; err != nil {
		t.Fatalf("the fetching job: %v", err)
	}
}
