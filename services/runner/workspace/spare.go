package workspace

// Spare worktrees.
//
// A new task's first job used to pay "git worktree add": a git process
// and a checkout of the whole tree (or of its sparse part) while a person
// waits for the agent. Instead, each project's clone can keep one spare
// worktree, checked out ahead at the default branch's remote head
// (detached, sparse as the registry says), and a new task whose branch
// would start at that very commit takes it: the directory is renamed to
// the task's, the worktree's record pointed at its new place, and the
// task's branch made at that commit and checked out, all in-process, with
// no file of the tree written. git's index keeps each file's stat data,
// which a rename of the directory above does not change, so the worktree
// is as clean as git left it. A new task that starts anywhere else gets a
// worktree of its own (handmade.go).
//
// MakeSpare makes the next one off the job's path (the runner calls it
// when a job ends); a spare whose commit the remote has left behind is
// made again there. Spares live in <root>/spares/<project>, which Clean
// empties at start, so a crash leaves nothing a later run could take for
// a task's worktree.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// spare is the spare worktree of a project's clone, as this process made
// it.
type spare struct {
	dir    string
	commit string
	sparse []string
}

// spareDir is where project's spare worktree is made.
func (w *Workspace) spareDir(project string) (string, error) {
	return w.inside("spares", project)
}

// MakeSpare makes project's spare worktree at the default branch's remote
// head, unless one is there already at that head with the same sparse
// directories. A project with no clone yet has none; one whose registry
// entry says spare_worktree: false (repo.NoSpare) has its spare removed.
// made reports whether a spare was made (not one there already).
func (w *Workspace) MakeSpare(ctx context.Context, repo Repo) (made bool, err error) {
	gitDir, err := w.RepoDir(repo.Project)
	if err != nil {
		return false, err
	}
	dir, err := w.spareDir(repo.Project)
	if err != nil {
		return false, err
	}
	rs := w.repo(repo.Project)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.url != repo.CloneURL {
		return false, nil // no clone this process set up for this URL
	}
	if repo.NoSpare {
		rs.spare = nil
		return false, removeSpare(ctx, gitDir, dir)
	}
	start := "refs/remotes/origin/" + repo.DefaultBranch
	commit, err := readRef(gitDir, start)
	if err != nil || !isOID(commit) {
		return false, nil // the readers cannot say: no spare, "worktree add" stays
	}
	if s := rs.spare; s != nil && s.commit == commit && slices.Equal(s.sparse, repo.Sparse) {
		return false, nil
	}
	rs.spare = nil
	if err := removeSpare(ctx, gitDir, dir); err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return false, fmt.Errorf("creating the spare worktree's parent: %w", err)
	}
	if len(repo.Sparse) == 0 && addByHand(ctx, gitDir, dir, "", commit, false) {
		rs.spare = &spare{dir: dir, commit: commit}
		return true, nil
	}
	add := []string{"worktree", "add", "--quiet", "--detach"}
	if len(repo.Sparse) > 0 {
		add = append(add, "--no-checkout")
	}
	if _, err := git(ctx, gitDir, append(add, dir, commit)...); err != nil {
		return false, fmt.Errorf("adding the spare worktree of %s: %w", repo.Project, err)
	}
	if len(repo.Sparse) > 0 {
		if err := sparseCheckout(ctx, dir, repo.Sparse); err != nil {
			_, _ = git(ctx, gitDir, "worktree", "remove", "--force", "--force", dir)
			return false, err
		}
	}
	rs.spare = &spare{dir: dir, commit: commit, sparse: slices.Clone(repo.Sparse)}
	return true, nil
}

// Spare is project's spare worktree, if this process has one ready and
// can say so at once (no other git command of the clone's is running):
// what a new task's sandbox can be made on before the task takes it (the
// runner's prestart.go). The spare may be taken by another task or made
// again before this one's worktree is prepared; what the sandbox bound is
// checked again then.
func (w *Workspace) Spare(project string) (dir string, ok bool) {
	rs := w.repo(project)
	if !rs.mu.TryLock() {
		return "", false
	}
	defer rs.mu.Unlock()
	if rs.spare == nil {
		return "", false
	}
	return rs.spare.dir, true
}

// removeSpare removes the spare worktree at dir, if there is one.
func removeSpare(ctx context.Context, gitDir, dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	if _, err := git(ctx, gitDir, "worktree", "remove", "--force", "--force", dir); err == nil {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the old spare worktree: %w", err)
	}
	_, err := git(ctx, gitDir, "worktree", "prune")
	return err
}

// takeSpare makes the spare worktree the task's at dir, on a new branch
// at commit (tracking origin/<branch> when track), when the spare is at
// that commit with the repository's sparse directories; it reports
// whether it did. The caller holds rs.mu, and branch does not exist.
func takeSpare(rs *repoState, gitDir, dir, branch, commit string, track bool, sparse []string) bool {
	s := rs.spare
	if s == nil || commit != s.commit || !slices.Equal(s.sparse, sparse) {
		return false
	}
	own, err := worktreeGitDir(s.dir)
	if err != nil {
		rs.spare = nil
		return false
	}
	if _, _, err := worktreeHead(own, gitDir); err != nil {
		rs.spare = nil
		return false
	}
	// From here on the spare is the task's, or gone.
	rs.spare = nil
	if err := os.Rename(s.dir, dir); err != nil {
		return false
	}
	// Four files, none of which another's write depends on: each is
	// written aside and renamed over the old one, which on ext4 starts
	// that file's writeback (auto_da_alloc), a few hundred microseconds
	// each on a loaded machine. They are written at once, and all of
	// them undone if any failed; no git command of the clone's runs
	// meanwhile (rs.mu), and no agent is in the worktree yet.
	var (
		pointed, branched, headSet, tracked bool
		writing                             sync.WaitGroup
	)
	writing.Go(func() { pointed = writeFile(filepath.Join(own, "gitdir"), filepath.Join(dir, ".git")+"\n") == nil })
	writing.Go(func() { branched = createBranch(gitDir, branch, s.commit) == nil })
	writing.Go(func() { headSet = writeFile(filepath.Join(own, "HEAD"), "ref: refs/heads/"+branch+"\n") == nil })
	tracked = !track
	if track {
		writing.Go(func() { tracked = setUpstream(gitDir, branch) == nil })
	}
	writing.Wait()
	ok := pointed && branched && headSet && tracked
	if !ok {
		// Back as it was, for "worktree add" to run as ever; the spare
		// itself is made again later.
		if headSet {
			_ = writeFile(filepath.Join(own, "HEAD"), s.commit+"\n")
		}
		if branched {
			removeBranch(gitDir, branch)
		}
		if track && tracked {
			unsetUpstream(gitDir, branch)
		}
		if pointed {
			_ = writeFile(filepath.Join(own, "gitdir"), filepath.Join(s.dir, ".git")+"\n")
		}
		_ = os.Rename(dir, s.dir)
	}
	return ok
}

// createBranch makes the loose ref refs/heads/<branch> at oid, as git
// does: the lock file created exclusively, then renamed. A branch that
// exists, loose or packed, is an error.
func createBranch(gitDir, branch, oid string) error {
	ref := "refs/heads/" + branch
	if cur, err := readRef(gitDir, ref); err != nil || cur != "" || !isOID(oid) {
		return fmt.Errorf("cannot create %s", ref)
	}
	p := filepath.Join(gitDir, filepath.FromSlash(ref))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(p+".lock", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return commitLock(lock, p, []byte(oid+"\n"))
}

// removeBranch removes the loose ref createBranch made.
func removeBranch(gitDir, branch string) {
	_ = os.Remove(filepath.Join(gitDir, "refs", "heads", filepath.FromSlash(branch)))
}

// setUpstream makes branch track origin/<branch>, as "worktree add
// --track" does: a section appended to the clone's config under git's
// lock (config.lock, created exclusively, renamed over the config). A
// name with a quote, a backslash or a newline, which the section would
// need escaped, is refused: the callers undo and leave the worktree to
// "worktree add".
func setUpstream(gitDir, branch string) error {
	if strings.ContainsAny(branch, "\"\\\n") {
		return fmt.Errorf("branch %q: a name a config section cannot hold as written", branch)
	}
	cfg := filepath.Join(gitDir, "config")
	lock, err := os.OpenFile(cfg+".lock", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	old, err := os.ReadFile(cfg)
	if err != nil {
		_ = lock.Close()
		_ = os.Remove(cfg + ".lock")
		return err
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		old = append(old, '\n')
	}
	return commitLock(lock, cfg, append(old, upstreamSection(branch)...))
}

// upstreamSection is the section setUpstream appends for branch.
func upstreamSection(branch string) string {
	return fmt.Sprintf("[branch \"%s\"]\n\tremote = origin\n\tmerge = refs/heads/%s\n", branch, branch)
}

// unsetUpstream takes back the section setUpstream appended for branch,
// when it is still the config's last, so that the next take does not
// append it twice; one that cannot be taken back is left.
func unsetUpstream(gitDir, branch string) {
	cfg := filepath.Join(gitDir, "config")
	lock, err := os.OpenFile(cfg+".lock", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	old, err := os.ReadFile(cfg)
	if rest, ok := strings.CutSuffix(string(old), upstreamSection(branch)); err == nil && ok {
		_ = commitLock(lock, cfg, []byte(rest))
		return
	}
	_ = lock.Close()
	_ = os.Remove(cfg + ".lock")
}

// commitLock writes data into lock, git's lock file of path, and renames
// it over path; the lock file goes if anything fails.
func commitLock(lock *os.File, path string, data []byte) error {
	_, err := lock.Write(data)
	if cerr := lock.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(lock.Name(), path)
	}
	if err != nil {
		_ = os.Remove(lock.Name())
	}
	return err
}

// writeFile replaces path's content with text: written aside, then
// renamed over it.
func writeFile(path, text string) error {
	tmp := path + ".lock"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}
