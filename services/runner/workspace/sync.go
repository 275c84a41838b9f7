package workspace

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Bringing a worktree to the head a job is about.
//
// Every job of a task reuses its worktree, so before each job the worktree
// is moved to the head the job's event names, or to a newer one on the
// remote: a review after a push must read the pushed code. What must hold
// while doing so: work that is not on the remote (commits an earlier job
// made and did not push, uncommitted changes) is never thrown away. A
// worktree holding such work that the head lacks stays as it is, and the
// Checkout's notes say so, for the agent to decide; git's own checks
// (`reset --keep`) refuse a move that would overwrite an uncommitted
// change.
//
// Which commits are "not on the remote" is judged against every remote
// branch and against baseRef, the last remote head the worktree was
// brought to: after a force push, the commits the remote dropped were
// never the worktree's own work, and the worktree follows the new head.

// baseRef is, per worktree, the last remote head the worktree was at or
// ahead of. It lives in the worktree's own ref namespace, so it goes with
// the worktree.
const baseRef = "refs/worktree/orch/base"

// maxListed caps the uncommitted paths a Checkout lists.
const maxListed = 20

// shaPattern is what a commit id from an event must look like before git
// is asked about it.
var shaPattern = regexp.MustCompile(`^[0-9a-f]{7,64}$`)

// bringToHead brings the worktree at dir to the head want names on branch, never
// losing work that is not on the remote, and reports where it is.
// pullHead, when not empty, is the head of a fork's pull request, fetched
// from origin's refs/pull/<n>/head: the remote head the worktree follows
// when branch is not on origin.
func bringToHead(ctx context.Context, wt worktree, want Want, branch, pullHead string) (Checkout, error) {
	dir := wt.dir
	co := Checkout{Dir: dir, Branch: branch}
	// Every commit the rest needs to know at the start, in one git
	// process rather than one each.
	revs := []string{"refs/remotes/origin/" + branch, "HEAD", baseRef}
	if want.HeadBranch != "" && want.HeadBranch != branch {
		revs = append(revs, "refs/remotes/origin/"+want.HeadBranch)
	}
	if shaPattern.MatchString(want.HeadSHA) {
		revs = append(revs, want.HeadSHA+"^{commit}")
	}
	known, err := wt.resolve(ctx, revs...)
	if err != nil {
		return co, err
	}
	remote := known["refs/remotes/origin/"+branch]
	switch {
	case remote != "":
		co.Upstream = "origin/" + branch
	case pullHead != "":
		remote = pullHead
	case want.HeadBranch != "" && want.HeadBranch != branch:
		// An agent branch spelt otherwise on the remote (agent/WID-41
		// for task wid-41) is followed too.
		remote = known["refs/remotes/origin/"+want.HeadBranch]
	}
	var event string
	if want.HeadSHA != "" {
		if shaPattern.MatchString(want.HeadSHA) {
			event = known[want.HeadSHA+"^{commit}"]
		}
		if event == "" {
			co.Notes = append(co.Notes, fmt.Sprintf("The event that made this job names head `%s`, which the remote does not have (any more).", want.HeadSHA))
		}
	}
	co.Target = newer(ctx, dir, remote, event)
	if event != "" && co.Target != event {
		co.Notes = append(co.Notes, fmt.Sprintf("The remote's head moved on since the event that made this job (`%s`): the job is for the newer `%s`.", short(event), short(co.Target)))
	}

	base := known[baseRef]
	st, err := inspect(ctx, wt, co.Target, known)
	if err != nil {
		return co, err
	}
	if cur := wt.currentBranch(ctx); cur != branch {
		if moved, why := switchBranch(ctx, dir, branch, co.Target, st); !moved {
			co.Branch, co.Upstream = cmp.Or(cur, "(detached HEAD)"), ""
			co.Notes = append(co.Notes, fmt.Sprintf("The worktree is on `%s`, not on `%s`: %s", co.Branch, branch, why))
		} else if st, err = inspect(ctx, wt, co.Target, nil); err != nil {
			return co, err
		}
	}
	if co.Branch == branch && co.Target != "" && st.head != co.Target && st.unpushed == 0 {
		// Nothing of the worktree's own is lost by moving: a fast-forward,
		// or the remote rewrote what it had. --keep refuses to overwrite
		// an uncommitted change.
		if _, err := git(ctx, dir, "reset", "--quiet", "--keep", co.Target, "--"); err != nil {
			co.Notes = append(co.Notes, fmt.Sprintf("Uncommitted changes are in the way of `%s`, so the worktree stayed at `%s` (%s).", short(co.Target), short(st.head), lastLine(err)))
		} else if st, err = inspect(ctx, wt, co.Target, nil); err != nil {
			return co, err
		}
	}
	co.Head, co.Unpushed, co.Uncommitted = st.head, st.unpushed, st.dirty
	if co.Target != "" && co.Head != co.Target && !isAncestor(ctx, dir, co.Target, co.Head) {
		co.Notes = append(co.Notes, fmt.Sprintf("The job is for `%s` at `%s`, but the worktree is at `%s` and does not contain it: it holds work that is not on the remote, kept as it was. Compare `git log HEAD..%s` and `git log %s..HEAD` before you go on.",
			cmp.Or(co.Upstream, "the head"), short(co.Target), short(co.Head), co.Target, co.Target))
	}
	if co.Unpushed > 0 {
		co.Notes = append(co.Notes, fmt.Sprintf("The branch holds %d commit(s) that are not on the remote (an earlier job's work, not pushed): kept.", co.Unpushed))
	}
	if len(co.Uncommitted) > 0 {
		co.Notes = append(co.Notes, "The worktree has uncommitted changes (an earlier job's work): kept. `git status` shows: "+strings.Join(co.Uncommitted, "; ")+".")
	}

	if co.Branch == branch && co.Target != "" && co.Target != base && isAncestor(ctx, dir, co.Target, co.Head) {
		if err := wt.setBase(ctx, co.Target); err != nil {
			return co, err
		}
	}
	if co.Branch == branch && co.Upstream != "" && !upstreamSet(wt.gitDir, branch) {
		if up, _ := git(ctx, dir, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}"); strings.TrimSpace(up) != co.Upstream {
			if _, err := git(ctx, dir, "branch", "--quiet", "--set-upstream-to="+co.Upstream); err != nil {
				return co, err
			}
		}
	}
	return co, nil
}

// state is what the worktree holds: its HEAD, how many of HEAD's commits
// are its own work (on no remote branch, not in target, not in baseRef),
// and its uncommitted changes.
type state struct {
	head     string
	unpushed int
	dirty    []string
}

// inspect reads the worktree's state; known, when not nil, holds HEAD and
// baseRef resolved already. Git is asked only what the refs do not
// answer: a HEAD at target or at baseRef has no commits of its own, and a
// worktree this job made, or one known clean (see knownClean), has no
// uncommitted changes.
func inspect(ctx context.Context, wt worktree, target string, known map[string]string) (state, error) {
	var st state
	dir := wt.dir
	if known == nil {
		var err error
		if known, err = wt.resolve(ctx, "HEAD", baseRef); err != nil {
			return st, err
		}
	}
	if st.head = known["HEAD"]; st.head == "" {
		return st, fmt.Errorf("worktree %s has no HEAD", dir)
	}
	if st.head != target && st.head != known[baseRef] {
		var err error
		if st.unpushed, err = countUnpushed(ctx, dir, target, known[baseRef]); err != nil {
			return st, err
		}
	}
	if wt.fresh {
		wt.markClean(st.head)
		return st, nil
	}
	if wt.knownClean(st.head) {
		return st, nil
	}
	// An untracked directory is listed as itself, not file by file, which
	// lets git keep its untracked cache (in the index, kept valid by the
	// directories' modification times): in a worktree of 50,000 files that
	// halves the time of status, which otherwise walks every directory.
	out, err := git(ctx, dir, "-c", "core.untrackedCache=true", "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return st, err
	}
	if strings.TrimSpace(out) == "" {
		wt.markClean(st.head)
	}
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if len(st.dirty) == maxListed {
			st.dirty = append(st.dirty, "…")
			break
		}
		st.dirty = append(st.dirty, strings.TrimSpace(l))
	}
	return st, nil
}

// countUnpushed counts the commits of HEAD in dir that are on no remote
// branch and in neither target nor base.
func countUnpushed(ctx context.Context, dir, target, base string) (int, error) {
	args := []string{"rev-list", "--count", "HEAD", "--not", "--remotes=origin"}
	for _, r := range []string{target, base} {
		if r != "" {
			args = append(args, r)
		}
	}
	out, err := git(ctx, dir, args...)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return 0, fmt.Errorf("counting unpushed commits: %w", err)
	}
	return n, nil
}

// switchBranch checks out branch in a worktree that is on another one (or
// detached) and holds no work of its own: the branch as it is when it
// exists, else made at target. It says why when it does not.
func switchBranch(ctx context.Context, dir, branch, target string, st state) (bool, string) {
	switch {
	case st.unpushed > 0 || len(st.dirty) > 0:
		return false, "it holds work that is not on the remote, kept as it was."
	case refExists(ctx, dir, "refs/heads/"+branch):
		_, err := git(ctx, dir, "checkout", "--quiet", branch, "--")
		if err != nil {
			return false, lastLine(err)
		}
	case target != "":
		_, err := git(ctx, dir, "checkout", "--quiet", "--no-track", "-b", branch, target, "--")
		if err != nil {
			return false, lastLine(err)
		}
	default:
		return false, "that branch is nowhere to be found."
	}
	return true, ""
}

// newer is the later of two commits when one descends from the other, a
// when they have diverged (the remote's head is the newer word), and
// whichever is known when the other is empty.
func newer(ctx context.Context, dir, a, b string) string {
	switch {
	case a == "" || a == b:
		return b
	case b == "":
		return a
	case isAncestor(ctx, dir, a, b):
		return b
	}
	return a
}

// isAncestor reports whether commit a is b or an ancestor of it.
func isAncestor(ctx context.Context, dir, a, b string) bool {
	if a == b && a != "" {
		return true
	}
	_, err := git(ctx, dir, "merge-base", "--is-ancestor", a, b)
	return err == nil
}

// resolve is the commit id rev names, empty if it names none.
func resolve(ctx context.Context, dir, rev string) string {
	out, err := git(ctx, dir, "rev-parse", "--verify", "--quiet", "--end-of-options", rev)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// resolveAll resolves each of revs in one git process (cat-file
// --batch-check), mapping it to its object id, or to "" where it names
// nothing.
func resolveAll(ctx context.Context, dir string, revs ...string) (map[string]string, error) {
	out, err := gitInput(ctx, dir, strings.Join(revs, "\n")+"\n", "cat-file", "--batch-check=%(objectname)")
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != len(revs) {
		return nil, fmt.Errorf("git cat-file answered %d lines for %d revisions", len(lines), len(revs))
	}
	known := make(map[string]string, len(revs))
	for i, l := range lines {
		if shaPattern.MatchString(l) {
			known[revs[i]] = l
		} else {
			known[revs[i]] = "" // "<rev> missing" or "<rev> ambiguous"
		}
	}
	return known, nil
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

// lastLine is the last line of err's text: git's own reason.
func lastLine(err error) string {
	s := strings.TrimSpace(err.Error())
	return s[strings.LastIndexByte(s, '\n')+1:]
}
