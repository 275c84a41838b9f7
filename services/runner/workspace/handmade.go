package workspace

// Worktrees made in-process.
//
// "git worktree add -b" runs four git processes (worktree add, then
// branch, symbolic-ref and reset --hard as its children) and reads the
// record of every worktree of the clone to check the new one's path and
// branch, all under the clone's lock: with a few hundred tasks'
// worktrees, some 15 ms a worktree on a 2-core VM, where the checkout
// alone ("git read-tree --reset -u") takes 4.5. So a worktree on a new
// branch, and a detached spare, is made as git makes it, with its small
// files written here: the branch's loose ref (createBranch), the
// worktree's record <clone>/worktrees/<name> (HEAD, commondir, gitdir)
// and its .git file, all as git writes them (absolute paths); then one
// "git read-tree --reset -u HEAD" writes its index and its files, and the
// branch is set to track its remote branch where it should (setUpstream).
// The record is named after the directory, as git names it, or with a
// random suffix when the clone has that name (newRecord). A sparse
// checkout, or any step that fails, leaves it to "worktree add" as
// before, once what was written is undone.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
)

// addByHand makes the worktree at dir checked out at commit: on branch,
// a new branch made there (tracking origin/<branch> when track), or
// detached when branch is "". It reports whether it did; when it did
// not, nothing of it is left. The caller holds the clone's lock, and
// dir's parent exists.
func addByHand(ctx context.Context, gitDir, dir, branch, commit string, track bool) bool {
	if !isOID(commit) || !filepath.IsAbs(dir) {
		return false
	}
	rec, ok := newRecord(gitDir, filepath.Base(dir))
	if !ok {
		return false
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		_ = os.RemoveAll(rec)
		return false
	}
	head := commit + "\n"
	if branch != "" {
		head = "ref: refs/heads/" + branch + "\n"
	}
	ok = writeFile(filepath.Join(rec, "commondir"), "../..\n") == nil &&
		writeFile(filepath.Join(rec, "gitdir"), filepath.Join(dir, ".git")+"\n") == nil &&
		writeFile(filepath.Join(rec, "HEAD"), head) == nil &&
		writeFile(filepath.Join(dir, ".git"), "gitdir: "+rec+"\n") == nil
	branched := false
	if ok && branch != "" {
		branched = createBranch(gitDir, branch, commit) == nil
		ok = branched
	}
	if ok {
		_, err := git(ctx, dir, "read-tree", "--reset", "-u", "HEAD")
		ok = err == nil
	}
	if ok && track {
		ok = setUpstream(gitDir, branch) == nil
	}
	if !ok {
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(rec)
		if branched {
			removeBranch(gitDir, branch)
		}
	}
	return ok
}

// newRecord creates the directory of a new worktree record in gitDir:
// worktrees/<name> as git would name it, or, when the clone has that name
// already (a record keeps its name when its worktree moves, as a spare
// taken does), the name with a random suffix, where git counts up through
// the names it has.
func newRecord(gitDir, name string) (string, bool) {
	records := filepath.Join(gitDir, "worktrees")
	if err := os.MkdirAll(records, 0o755); err != nil {
		return "", false
	}
	rec := filepath.Join(records, name)
	if os.Mkdir(rec, 0o755) == nil {
		return rec, true
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	rec += "-" + hex.EncodeToString(b[:])
	return rec, os.Mkdir(rec, 0o755) == nil
}
