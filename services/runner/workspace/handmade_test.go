package workspace_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/services/runner/workspace"
)

// A worktree made in-process (handmade.go) is one git knows as its own:
// listed on its branch, clean, kept by a prune, its branch tracking the
// remote's where the task's branch was pushed. A worktree whose name the
// clone already records (a task named like the project's spare, a spare
// made after one was taken and kept its record's name) gets a name of its
// own, and all stay sound; each is made with one git process, the
// checkout.
func TestHandMadeWorktreesAreGits(t *testing.T) {
	ctx := context.Background()
	o, _ := newOrigin(t)
	ws, repo := o.setup()
	gitDir, err := ws.RepoDir(repo.Project)
	if err != nil {
		t.Fatal(err)
	}

	co := prepare(t, ws, repo, workspace.Want{Task: "wid-1", Since: time.Now()})
	if co.Made != workspace.MadeByAdd {
		t.Fatalf("new task's worktree made %v, want by add", co.Made)
	}
	gitOut(t, gitDir, "worktree", "prune")
	if list := gitOut(t, gitDir, "worktree", "list", "--porcelain"); !strings.Contains(list, "worktree "+co.Dir+"\nHEAD "+co.Head+"\nbranch refs/heads/agent/wid-1") {
		t.Errorf("git lists\n%s\nwithout %s on agent/wid-1 at %s", list, co.Dir, co.Head)
	}
	if st := gitOut(t, co.Dir, "status", "--porcelain", "--untracked-files=all"); st != "" {
		t.Errorf("new worktree not clean: %q", st)
	}
	if _, err := gitRun(co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); err == nil {
		t.Error("a branch made from main tracks something")
	}

	// The task's branch was pushed, somewhere else than main's head.
	gitOut(t, o.author, "checkout", "-q", "-b", "agent/wid-2", "main")
	pushed := o.commit("wid-2.txt", "pushed\n")
	co = prepare(t, ws, repo, workspace.Want{Task: "wid-2", Since: time.Now()})
	if co.Head != pushed {
		t.Fatalf("wid-2 at %s, want its pushed branch at %s", co.Head, pushed)
	}
	if up := gitOut(t, co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); up != "origin/agent/wid-2" {
		t.Errorf("wid-2 tracks %q, want origin/agent/wid-2", up)
	}

	// A pushed branch whose name a config section cannot hold as
	// written (a quote) is refused by setUpstream; "worktree add" makes
	// it, tracking as git escapes it.
	quoted := `fix"quote`
	gitOut(t, o.author, "checkout", "-q", "-b", quoted, "main")
	o.commit("quote.txt", "quoted\n")
	co = prepare(t, ws, repo, workspace.Want{Task: "pr-9", HeadBranch: quoted, PR: 9, Since: time.Now()})
	if co.Branch != quoted {
		t.Fatalf("pr-9 on %q, want %q", co.Branch, quoted)
	}
	if up := gitOut(t, co.Dir, "rev-parse", "--abbrev-ref", "@{upstream}"); up != "origin/"+quoted {
		t.Errorf("pr-9 tracks %q, want origin/%s", up, quoted)
	}
	if st := gitOut(t, co.Dir, "status", "--porcelain", "--untracked-files=all"); st != "" {
		t.Errorf("pr-9's worktree not clean: %q", st)
	}

	// The spare is recorded as "widgets"; so would be task widgets'
	// worktree.
	makeSpare := func() {
		t.Helper()
		if _, ran := gitCalls(t, func() (workspace.Checkout, error) {
			_, err := ws.MakeSpare(ctx, repo)
			return workspace.Checkout{}, err
		}); len(ran) != 1 || ran[0] != "git read-tree --reset -u HEAD" {
			t.Errorf("making the spare ran git %d times, want once (the checkout):\n%s", len(ran), strings.Join(ran, "\n"))
		}
	}
	makeSpare()
	gitOut(t, o.author, "checkout", "-q", "-b", "agent/widgets", "main")
	o.commit("widgets.txt", "elsewhere\n")
	co = prepare(t, ws, repo, workspace.Want{Task: "widgets", Since: time.Now()})
	spare := filepath.Join(ws.Root, "spares", repo.Project)
	if co.Made != workspace.MadeByAdd {
		t.Fatalf("task widgets made %v, want by add", co.Made)
	}
	if own, theirs := gitOut(t, co.Dir, "rev-parse", "--git-dir"), gitOut(t, spare, "rev-parse", "--git-dir"); own == theirs || filepath.Base(theirs) != "widgets" {
		t.Errorf("task widgets' record %s, the spare's %s: want the spare's named widgets, the task's otherwise", own, theirs)
	}
	// A new task at main's head takes the spare; the next spare's name
	// is still the old one's record.
	taken := prepare(t, ws, repo, workspace.Want{Task: "wid-3", Since: time.Now()})
	if taken.Made != workspace.MadeFromSpare {
		t.Fatalf("wid-3 made %v, want from the spare", taken.Made)
	}
	makeSpare()
	list := gitOut(t, gitDir, "worktree", "list", "--porcelain")
	for _, dir := range []string{co.Dir, spare, taken.Dir} {
		if !strings.Contains(list, "worktree "+dir+"\n") {
			t.Errorf("git lists\n%s\nwithout %s", list, dir)
		}
		if st := gitOut(t, dir, "status", "--porcelain"); st != "" {
			t.Errorf("%s not clean: %q", dir, st)
		}
	}
}
