package runner_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// git runs git in dir for the test (as the pull request's author would)
// and returns its output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	args = append([]string{"-C", dir, "-c", "user.name=author", "-c", "user.email=author@example.com"}, args...)
	out, err := exec.Command("git", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Every job of a pull request runs at the head its event names, or a
// newer one: the review of an opened pull request at A, after the author
// pushed B the next review at B. A job told to push updates the pull
// request's own branch. Commits and changes an agent left unpushed
// survive the next job, which says so in its task file.
func TestJobsRunAtThePRHead(t *testing.T) {
	e := newEnv(t, "")
	// The author's branch, in the origin (which keeps main checked out,
	// so pushes to feature/x are accepted).
	authorCommit := func(file, text string) string {
		t.Helper()
		git(t, e.remote, "checkout", "-q", "feature/x")
		if err := os.WriteFile(filepath.Join(e.remote, file), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, e.remote, "add", file)
		git(t, e.remote, "commit", "-q", "-m", "author: "+file)
		sha := git(t, e.remote, "rev-parse", "HEAD")
		git(t, e.remote, "checkout", "-q", "main")
		return sha
	}
	git(t, e.remote, "branch", "feature/x")
	a := authorCommit("feature.txt", "A\n")

	// The stand-in agent records where it started and its task; a fix
	// commits and pushes, a respond commits without pushing and leaves
	// a file behind.
	id := `-c user.name=agent -c user.email=agent@localhost`
	cfg := e.config("r1", e.script(`git rev-parse HEAD > $RUNS/head.$ORCH_JOB_ID
cp "$ORCH_TASK_FILE" $RUNS/task.$ORCH_JOB_ID
case "$ORCH_KIND" in
fix) echo fixed > fix.txt && git add fix.txt && git `+id+` commit -q -m fix && git push -q ;;
respond) echo mine > mine.txt && git add mine.txt && git `+id+` commit -q -m mine && echo scratch > scratch.txt ;;
esac
`))
	e.start(cfg)
	run := func(name string, kind proto.Kind, head string) (started, task string) {
		t.Helper()
		j := job(name, "pr-7", kind)
		j.Task.PR, j.Task.Branch, j.Task.HeadSHA = 7, "feature/x", head
		e.enqueue(j)
		e.waitState(j.ID, proto.StateDone, 30*time.Second)
		h, err := os.ReadFile(filepath.Join(e.runs, "head."+j.ID))
		if err != nil {
			t.Fatal(err)
		}
		text, err := os.ReadFile(filepath.Join(e.runs, "task."+j.ID))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(h)), string(text)
	}

	head, task := run("opened", proto.KindReview, a)
	if head != a || !strings.Contains(task, "prepared at commit `"+a+"`") {
		t.Fatalf("opened: agent started at %s, want %s; task:\n%s", head, a, task)
	}
	b := authorCommit("feature.txt", "B\n")
	if head, task = run("synchronized", proto.KindReview, b); head != b || !strings.Contains(task, "prepared at commit `"+b+"`") {
		t.Fatalf("synchronized: agent started at %s, want %s; task:\n%s", head, b, task)
	}

	if head, _ = run("fix", proto.KindFix, b); head != b {
		t.Fatalf("fix: agent started at %s, want %s", head, b)
	}
	pushed := git(t, e.remote, "rev-parse", "feature/x")
	if pushed == b || git(t, e.remote, "log", "-1", "--format=%s", "feature/x") != "fix" {
		t.Fatalf("the agent's push did not update feature/x (at %s)", pushed)
	}
	if branches := git(t, e.remote, "branch", "--list", "agent/*"); branches != "" {
		t.Errorf("the push made a branch beside the pull request's: %s", branches)
	}

	run("respond", proto.KindRespond, pushed)
	mine := git(t, filepath.Join(cfg.WorkspaceDir, "worktrees", "widgets", "pr-7"), "rev-parse", "HEAD")
	c := authorCommit("other.txt", "C\n")
	if head, task = run("after the author's push", proto.KindReview, c); head != mine {
		t.Errorf("agent started at %s, want the kept unpushed commit %s", head, mine)
	}
	for _, want := range []string{"prepared at commit `" + head + "`", c[:12], "1 commit(s) that are not on the remote", "scratch.txt"} {
		if !strings.Contains(task, want) {
			t.Errorf("task file lacks %q:\n%s", want, task)
		}
	}
}
