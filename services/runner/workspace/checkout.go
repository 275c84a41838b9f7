package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Want is what a job asks of its task's worktree.
type Want struct {
	// Task is the task id. It names the worktree and, unless HeadBranch
	// is a branch of someone else's, the branch agent/<task>.
	Task string
	// HeadBranch is the head branch of the pull request (or workflow run)
	// the job is about, empty when there is none.
	HeadBranch string
	// HeadSHA is the commit the job's event names as HeadBranch's head,
	// empty when it names none.
	HeadSHA string
	// PR is the number of the Gitea pull request the job is about, 0 when
	// there is none. When HeadBranch is not on origin (a pull request from
	// a fork), the pull request's head is fetched from Gitea's
	// refs/pull/<PR>/head instead.
	PR int
	// Fork says the pull request's head is not in origin (the gateway
	// knows from the payload, proto.Task.FromFork): HeadBranch is only the
	// fork's name for its branch, which origin may have a branch of its
	// own by, so the head is always fetched from refs/pull/<PR>/head.
	Fork bool
	// Since is when the job's event happened: a fetch of the clone that
	// started later has seen the remote the job is about. Zero asks for a
	// fetch that starts now.
	Since time.Time
}

// Checkout is a task's worktree as its job finds it.
type Checkout struct {
	// Dir is the worktree.
	Dir string
	// Branch is the branch checked out.
	Branch string
	// Upstream is the remote branch Branch tracks (origin/<Branch>), the
	// one a plain `git push` updates; empty while Branch is not on the
	// remote.
	Upstream string
	// Head is the commit checked out: the commit the job was prepared at.
	Head string
	// Target is the commit the job is to run at: the newer of the job's
	// HeadSHA and the remote's head of Branch; empty when neither is
	// known. Head is not Target only when the worktree holds work that is
	// not on the remote: that work is kept, and Notes say so.
	Target string
	// Unpushed counts the commits of Branch that are on no remote branch,
	// and Uncommitted lists the paths with uncommitted changes (as `git
	// status --short` shows them, at most maxListed): an earlier job's
	// work, kept.
	Unpushed    int
	Uncommitted []string
	// Notes tell the agent, a sentence each, where the worktree is not
	// simply at Target.
	Notes []string
	// Made says how this job made the worktree: MadeFromSpare, MadeByAdd,
	// or "" when it was there already.
	Made string
}

// How a job made its task's worktree (Checkout.Made).
const (
	MadeFromSpare = "spare"
	MadeByAdd     = "worktree add"
)

// Prepare makes sure the task's worktree exists and is at the head the job
// is about, and returns what it found and did.
//
// The project's clone is made if missing and fetched. The worktree is on
// the pull request's head branch when the job names one that is not an
// agent branch (so the agent's `git push` updates the pull request), else
// on agent/<task>; a job that names no head branch keeps the branch the
// worktree is on. A new branch starts from the first of origin/<branch>,
// origin/<head branch> and origin/<default branch> that exists.
//
// Then the worktree is brought to Target, the newer of want.HeadSHA and
// origin/<branch>. Work that is not on the remote is never thrown away: a
// worktree with commits of its own that Target lacks, or with
// uncommitted changes in the way, stays as it is, and Checkout.Notes say
// so (see bringToHead).
//
// Concurrent calls for one project share fetches: each call waits for a
// fetch that started after want.Since (or after the call), joining one
// another call started rather than running its own, and needs none when
// one already did (see fetcher), so the remote's state at want.Since is
// always seen.
func (w *Workspace) Prepare(ctx context.Context, repo Repo, want Want) (Checkout, error) {
	dir, err := w.WorktreeDir(repo.Project, want.Task)
	if err != nil {
		return Checkout{}, err
	}
	gitDir, err := w.RepoDir(repo.Project)
	if err != nil {
		return Checkout{}, err
	}
	rs := w.repo(repo.Project)
	rs.mu.Lock()
	if _, serr := os.Stat(filepath.Join(gitDir, "HEAD")); rs.url != repo.CloneURL || serr != nil {
		if err = w.ensureClone(ctx, gitDir, repo.CloneURL); err == nil {
			rs.url = repo.CloneURL
		}
	}
	rs.mu.Unlock()
	if err != nil {
		return Checkout{}, err
	}
	if !headKnown(gitDir, want) {
		err = rs.fetches.fetch(ctx, want.Since, func(ctx context.Context) error { return w.fetchOrigin(ctx, rs, gitDir) })
		if err != nil {
			return Checkout{}, fmt.Errorf("fetching %s: %w", repo.Project, err)
		}
	}

	rs.mu.Lock()
	defer rs.mu.Unlock()
	branch := want.branch(ctx, gitDir)
	var notes []string
	// A fork's head branch (as the gateway says, or one that origin does
	// not have): the job runs at the pull request's head as Gitea keeps
	// it, on the task's own branch, since nothing the agent pushes can
	// reach the fork. A fork's branch may share its name with one of
	// origin's (main, an agent's branch): that one is never used.
	var pullHead string
	if want.PR > 0 && (want.Fork || branch == want.HeadBranch && !refExists(ctx, gitDir, "refs/remotes/origin/"+branch)) {
		var note string
		pullHead, note = w.fetchPull(ctx, gitDir, want)
		notes = append(notes, note)
		if pullHead != "" || want.Fork {
			branch = Branch(want.Task)
		}
	}
	if own := Branch(want.Task); branch != own {
		// git checks a branch out in one worktree only: another task's
		// pull request from the same branch may have it.
		if other := holder(ctx, gitDir, branch, dir); other != "" {
			notes = append(notes, fmt.Sprintf("The pull request's head branch `%s` is checked out for another task (%s), so this worktree is on `%s`, following `origin/%s`. To update the pull request, push with `git push origin HEAD:%s`.",
				branch, filepath.Base(other), own, branch, branch))
			branch = own
		}
	}
	wt := worktree{dir: dir, gitDir: gitDir}
	made := ""
	if wt.own, err = worktreeGitDir(dir); err == nil || isWorktree(ctx, dir) {
		if cur := wt.currentBranch(ctx); want.HeadBranch == "" && cur != "" {
			branch = cur
		}
	} else if base, spare, err := w.addWorktree(ctx, gitDir, dir, repo, want, branch); err != nil {
		return Checkout{}, err
	} else {
		made = MadeByAdd
		if spare {
			made = MadeFromSpare
		}
		wt.own, _ = worktreeGitDir(dir)
		wt.fresh = true
		// A branch made from a remote branch starts at a remote head,
		// which is its base: nothing in it is the worktree's own work,
		// and no git process need count that.
		if isOID(base) {
			if err := wt.setBase(ctx, base); err != nil {
				return Checkout{}, err
			}
		}
	}
	co, err := bringToHead(ctx, wt, want, branch, pullHead)
	if err != nil {
		return Checkout{}, fmt.Errorf("bringing the worktree of %s to its head: %w", want.Task, err)
	}
	co.Notes = append(notes, co.Notes...)
	co.Made = made
	return co, nil
}

// fetchOrigin fetches origin's branches into the clone. The fetch runs
// outside rs.mu, beside other jobs' worktree work: it writes objects,
// which git writes safely beside any other writer, and refs under
// refs/remotes/origin, which nothing else here writes, each with git's
// own lock (the agents' git already writes the clone beside it: their
// commits, pushes and the maintenance these start). It writes no
// FETCH_HEAD, which fetchPull would write beside it, and starts no
// maintenance of its own: git's automatic maintenance (gc --auto, when
// the clone holds enough loose objects or packs) runs after it under
// rs.mu, as it did inside the fetch, so that it never packs or prunes
// while a worktree is being made. A fetch from a slow remote (seconds,
// over the network) no longer holds back the jobs of the project that
// need none.
func (w *Workspace) fetchOrigin(ctx context.Context, rs *repoState, gitDir string) error {
	if _, err := git(ctx, gitDir, w.fetchArgs("-c", "maintenance.auto=false", "fetch", "--prune", "--quiet", "--no-write-fetch-head", "origin")...); err != nil {
		return err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	// A maintenance that fails leaves the clone as it was: the next
	// fetch's tries again.
	_, _ = git(ctx, gitDir, "maintenance", "run", "--auto", "--quiet")
	return nil
}

// headKnown reports whether the clone already has what a job asks for,
// so that it needs no fetch: the job names its head branch and commit,
// and origin/<head branch> in the clone is that commit. The remote had
// it when the job's event happened (want.Since), which is all a fetch
// would guarantee; a remote that moved on since has sent an event of its
// own. A job that asks for a fetch that starts now (a zero Since, a
// retry) always fetches.
func headKnown(gitDir string, want Want) bool {
	if want.Since.IsZero() || want.HeadBranch == "" || !isOID(want.HeadSHA) {
		return false
	}
	oid, err := readRef(gitDir, "refs/remotes/origin/"+want.HeadBranch)
	return err == nil && oid == want.HeadSHA
}

// PullRefs holds, in the clone, the heads of forks' pull requests
// fetched from origin: outside refs/remotes/origin, which every fetch
// --prune tidies. Their commits are on origin (package taskstate does not
// carry them).
const PullRefs = "refs/orch/pull"

// pullRef is where the head of pull request n of a fork is kept.
func pullRef(n int) string { return fmt.Sprintf("%s/%d/head", PullRefs, n) }

// fetchPull fetches the head of want's pull request from origin's
// refs/pull/<n>/head (Gitea keeps one for every pull request, forks'
// included) and returns it, with a note for the agent: that it runs on
// the pull request's head and cannot push to the fork, or, when the ref
// could not be fetched, that it runs without the pull request's code.
func (w *Workspace) fetchPull(ctx context.Context, gitDir string, want Want) (head, note string) {
	src := fmt.Sprintf("refs/pull/%d/head", want.PR)
	if _, err := git(ctx, gitDir, w.fetchArgs("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "origin", "+"+src+":"+pullRef(want.PR))...); err != nil {
		return "", fmt.Sprintf("The pull request's head branch `%s` is not on origin (a fork's branch?), and origin's `%s` could not be fetched (%s): the worktree does not hold the pull request's changes.",
			want.HeadBranch, src, lastLine(err))
	}
	head = resolve(ctx, gitDir, pullRef(want.PR))
	return head, fmt.Sprintf("The pull request comes from a fork: its head branch `%s` is the fork's, not origin's. The worktree holds the pull request's head as origin keeps it (`%s`, `%s`) on the branch `%s`, which tracks nothing. You cannot push to the fork: no push of yours updates this pull request.",
		want.HeadBranch, src, short(head), Branch(want.Task))
}

// holder is the worktree other than dir that has branch checked out,
// empty if none has.
func holder(ctx context.Context, gitDir, branch, dir string) string {
	if path, err := holderOf(gitDir, branch, dir); err == nil {
		return path
	}
	return holderByGit(ctx, gitDir, branch, dir)
}

// holderByGit is holder as git worktree list tells it.
func holderByGit(ctx context.Context, gitDir, branch, dir string) string {
	out, err := git(ctx, gitDir, "worktree", "list", "--porcelain")
	if err != nil {
		return ""
	}
	var path string
	for _, l := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(l, "worktree "); ok {
			path = p
		}
		if l == "branch refs/heads/"+branch {
			return otherThan(path, dir)
		}
	}
	return ""
}

// otherThan is path, the worktree that has a branch checked out, unless
// it is dir itself or a record of a directory gone, which a prune drops
// when "worktree add" trips over it.
func otherThan(path, dir string) string {
	fi, err := os.Stat(path)
	if mine, _ := os.Stat(dir); err != nil || mine != nil && os.SameFile(fi, mine) {
		return ""
	}
	return path
}

// branch is the branch the job wants the worktree on: the head branch of
// its pull request when that is not an agent branch and is a branch name
// git accepts, else agent/<task>. "@" and "@{...}", which git reads as
// other branches (HEAD's, an earlier one), are never taken.
func (w Want) branch(ctx context.Context, gitDir string) string {
	h := w.HeadBranch
	if h == "" || strings.HasPrefix(h, BranchPrefix) || strings.HasPrefix(h, "-") || h == "@" || strings.Contains(h, "@{") {
		return Branch(w.Task)
	}
	if !branchNameOK(h) {
		if _, err := git(ctx, gitDir, "check-ref-format", "--branch", h); err != nil {
			return Branch(w.Task)
		}
	}
	return h
}

// addWorktree adds the task's worktree at dir on branch, made from its
// start point if it does not exist yet; base and spare are as worktreeAdd
// says.
func (w *Workspace) addWorktree(ctx context.Context, gitDir, dir string, repo Repo, want Want, branch string) (base string, spare bool, err error) {
	// A directory that is not a working worktree is what a crash during
	// "worktree add" leaves: start it again. Its record goes with a
	// prune, which reads every worktree's record, so it runs only when
	// there is something to prune: a leftover directory, or a record
	// that makes "worktree add" fail.
	if _, err := os.Stat(dir); err == nil {
		if err := os.RemoveAll(dir); err != nil {
			return "", false, fmt.Errorf("removing broken worktree: %w", err)
		}
		if _, err := git(ctx, gitDir, "worktree", "prune"); err != nil {
			return "", false, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", false, fmt.Errorf("creating worktree parent: %w", err)
	}
	base, spare, err = w.worktreeAdd(ctx, gitDir, dir, repo, want, branch)
	if err != nil {
		if _, perr := git(ctx, gitDir, "worktree", "prune"); perr == nil {
			base, spare, err = w.worktreeAdd(ctx, gitDir, dir, repo, want, branch)
		}
	}
	if err != nil {
		return "", false, fmt.Errorf("adding worktree for %s: %w", want.Task, err)
	}
	return base, spare, nil
}

// worktreeAdd runs "worktree add" of dir on branch, made from its start
// point if it does not exist yet, or takes the project's spare for it
// (spare). base is the commit a new branch was made at, its remote start
// point's as read then (a fetch outside rs.mu may move that ref
// meanwhile), "" when branch existed or the commit could not be read.
func (w *Workspace) worktreeAdd(ctx context.Context, gitDir, dir string, repo Repo, want Want, branch string) (base string, spare bool, err error) {
	add := []string{"worktree", "add", "--quiet"}
	if len(repo.Sparse) > 0 {
		add = append(add, "--no-checkout") // checked out once sparse
	}
	start := ""
	if refExists(ctx, gitDir, "refs/heads/"+branch) {
		add = append(add, dir, branch)
	} else {
		for _, b := range []string{branch, want.HeadBranch, repo.DefaultBranch} {
			if b != "" && refExists(ctx, gitDir, "refs/remotes/origin/"+b) {
				start = "refs/remotes/origin/" + b
				break
			}
		}
		if start == "" {
			return "", false, fmt.Errorf("project %s: no branch %q to start %s from", repo.Project, repo.DefaultBranch, branch)
		}
		// A branch made from its own remote branch tracks it, as the
		// worktree's job wants (see bringToHead), without another git
		// process to say so. The start's commit is read once, for the
		// spare and the worktree made in-process; a ref the readers
		// cannot read leaves both to "worktree add".
		tracks := start == "refs/remotes/origin/"+branch
		if commit, err := readRef(gitDir, start); err == nil {
			if takeSpare(w.repo(repo.Project), gitDir, dir, branch, commit, tracks, repo.Sparse) {
				return commit, true, nil
			}
			if len(repo.Sparse) == 0 && addByHand(ctx, gitDir, dir, branch, commit, tracks) {
				return commit, false, nil
			}
		}
		track := "--no-track"
		if tracks {
			track = "--track"
		}
		add = append(add, track, "-b", branch, dir, start)
	}
	if _, err := git(ctx, gitDir, add...); err != nil {
		return "", false, err
	}
	if len(repo.Sparse) > 0 {
		if err := sparseCheckout(ctx, dir, repo.Sparse); err != nil {
			// Not left half made: a later job would take the empty
			// worktree for a finished one.
			_, _ = git(ctx, gitDir, "worktree", "remove", "--force", "--force", dir)
			return "", false, err
		}
	}
	if start == "" {
		return "", false, nil
	}
	// The commit git made the branch at, as it read start.
	if base, err = readRef(gitDir, "refs/heads/"+branch); err != nil {
		base = ""
	}
	return base, false, nil
}

// sparseCheckout checks out, in the worktree at dir made without a
// checkout, only dirs and the files at the top (git's cone mode).
func sparseCheckout(ctx context.Context, dir string, dirs []string) error {
	if _, err := git(ctx, dir, append([]string{"sparse-checkout", "set", "--cone", "--"}, dirs...)...); err != nil {
		return fmt.Errorf("sparse checkout: %w", err)
	}
	if _, err := git(ctx, dir, "checkout", "--quiet"); err != nil {
		return fmt.Errorf("sparse checkout: %w", err)
	}
	return nil
}

// currentBranch is the branch checked out in dir, empty when its HEAD is
// detached.
func currentBranch(ctx context.Context, dir string) string {
	out, err := git(ctx, dir, "symbolic-ref", "--quiet", "--short", "HEAD")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}
