package workspace

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Reading refs without running git.
//
// A job in a worktree that is already where it should be needs no change,
// and finding that out with git costs a process per question (each a few
// milliseconds of loading and relocating git). The answers are in a few
// small files, which these readers open directly: the worktree's .git
// file names its private git directory, whose HEAD names the branch; a
// branch is a loose ref file in the clone or a line of its packed-refs.
//
// The readers only ever shorten the path: every answer is either certain
// (a loose ref, a packed ref, or a ref that is in neither and so does not
// exist) or errRefsUnknown, on which the caller asks git as it would
// without them. A clone whose refs git keeps otherwise (the reftable
// format) is always unknown.

// errRefsUnknown is a question the readers cannot answer for certain.
var errRefsUnknown = errors.New("refs not readable in-process")

// readRef returns the object id ref names in the git directory gitDir,
// following symbolic refs (within gitDir), "" when ref does not exist,
// or errRefsUnknown.
func readRef(gitDir, ref string) (string, error) {
	for range 5 {
		target, err := readRefOnce(gitDir, ref)
		if err != nil {
			return "", err
		}
		sym, ok := strings.CutPrefix(target, "ref: ")
		if !ok {
			return target, nil
		}
		ref = sym
	}
	return "", errRefsUnknown
}

// readRefOnce returns ref's content in gitDir: an object id, "ref: <ref>"
// for a symbolic ref, "" when it does not exist.
func readRefOnce(gitDir, ref string) (string, error) {
	if ref != "HEAD" && !strings.HasPrefix(ref, "refs/") || strings.Contains(ref, "..") {
		return "", errRefsUnknown
	}
	if _, err := os.Stat(filepath.Join(gitDir, "reftable")); err == nil {
		return "", errRefsUnknown
	}
	b, err := os.ReadFile(filepath.Join(gitDir, filepath.FromSlash(ref)))
	switch {
	case err == nil:
		s := strings.TrimSpace(string(b))
		if strings.HasPrefix(s, "ref: ") || isOID(s) {
			return s, nil
		}
		return "", errRefsUnknown
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, syscall.EISDIR):
		// A directory of refs (refs/heads/a when a/b exists): no ref.
	default:
		return "", errRefsUnknown
	}
	if ref == "HEAD" || strings.HasPrefix(ref, "refs/worktree/") {
		return "", nil // never packed in a worktree's own directory
	}
	return packedRef(gitDir, ref)
}

// packedRef looks ref up in gitDir's packed-refs.
func packedRef(gitDir, ref string) (string, error) {
	b, err := os.ReadFile(filepath.Join(gitDir, "packed-refs"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", errRefsUnknown
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' || l[0] == '^' {
			continue
		}
		oid, name, ok := strings.Cut(l, " ")
		if !ok || !isOID(oid) {
			return "", errRefsUnknown
		}
		if name == ref {
			return oid, nil
		}
	}
	if sc.Err() != nil {
		return "", errRefsUnknown
	}
	return "", nil
}

// isOID reports a full object id (SHA-1 or SHA-256) in lower-case hex.
func isOID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// worktreeGitDir is the private git directory of the worktree at dir, as
// its .git file names it, or errRefsUnknown when dir's .git is anything
// else (missing, a directory, a record git no longer has).
func worktreeGitDir(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, ".git"))
	if err != nil {
		return "", errRefsUnknown
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
	if !ok {
		return "", errRefsUnknown
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	for _, f := range []string{"HEAD", "commondir", "gitdir"} {
		if _, err := os.Stat(filepath.Join(p, f)); err != nil {
			return "", errRefsUnknown
		}
	}
	return p, nil
}

// worktreeHead is the branch the worktree whose private git directory is
// wtDir has checked out ("" when its HEAD is detached) and the commit of
// its HEAD ("" on an unborn branch); refs are looked up in the clone at
// gitDir.
func worktreeHead(wtDir, gitDir string) (branch, head string, err error) {
	target, err := readRefOnce(wtDir, "HEAD")
	if err != nil {
		return "", "", err
	}
	ref, ok := strings.CutPrefix(target, "ref: ")
	if !ok {
		if target == "" {
			return "", "", errRefsUnknown
		}
		return "", target, nil
	}
	branch, ok = strings.CutPrefix(ref, "refs/heads/")
	if !ok {
		return "", "", errRefsUnknown
	}
	head, err = readRef(gitDir, ref)
	return branch, head, err
}

// upstreamSet reports whether gitDir's config has branch track
// origin/<branch> (branch.<branch>.remote = origin and .merge =
// refs/heads/<branch>), as `git branch --set-upstream-to` writes it. A
// config the reader does not follow (includes, quoting) reads as not
// set, and git is asked.
func upstreamSet(gitDir, branch string) bool {
	b, err := os.ReadFile(filepath.Join(gitDir, "config"))
	if err != nil {
		return false
	}
	header := fmt.Sprintf("[branch %q]", branch)
	in := false
	var remote, merge string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[") {
			if strings.HasPrefix(strings.ToLower(l), "[include") {
				return false
			}
			in = l == header
			continue
		}
		if !in {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "remote":
			remote = strings.TrimSpace(v)
		case "merge":
			merge = strings.TrimSpace(v)
		}
	}
	return remote == "origin" && merge == "refs/heads/"+branch
}

// writeWorktreeRef points ref, one of the worktree's own refs
// (refs/worktree/...), at oid, as a loose ref in the worktree's private
// git directory wtDir. It is written aside and renamed, as git does; no
// other process writes these refs (the task lock keeps one job in the
// worktree).
func writeWorktreeRef(wtDir, ref, oid string) error {
	if !strings.HasPrefix(ref, "refs/worktree/") || !isOID(oid) {
		return fmt.Errorf("not a worktree ref: %s %s", ref, oid)
	}
	p := filepath.Join(wtDir, filepath.FromSlash(ref))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", ref, err)
	}
	if err := writeFile(p, oid+"\n"); err != nil {
		return fmt.Errorf("writing %s: %w", ref, err)
	}
	return nil
}

// worktree is a task's worktree as Prepare works on it.
type worktree struct {
	// dir is the worktree, gitDir the project's clone.
	dir, gitDir string
	// own is the worktree's private git directory, "" when it cannot be
	// read in-process: then git answers every question.
	own string
	// fresh: this job made the worktree, so nothing in it is uncommitted.
	fresh bool
}

// resolve maps each of revs (HEAD, refs, and <oid>^{commit}) to the
// object id it names, "" for none, reading the refs in-process when it
// can, else in one git process (see resolveAll). An <oid>^{commit} is
// answered in-process only when one of the refs read names that commit.
func (wt worktree) resolve(ctx context.Context, revs ...string) (map[string]string, error) {
	if wt.own == "" {
		return resolveAll(ctx, wt.dir, revs...)
	}
	known := make(map[string]string, len(revs))
	var commits []string
	for _, r := range revs {
		var oid string
		var err error
		switch {
		case r == "HEAD":
			_, oid, err = worktreeHead(wt.own, wt.gitDir)
		case strings.HasPrefix(r, "refs/worktree/"):
			oid, err = readRef(wt.own, r)
		case strings.HasPrefix(r, "refs/"):
			oid, err = readRef(wt.gitDir, r)
		default:
			commits = append(commits, r)
			continue
		}
		if err != nil {
			return resolveAll(ctx, wt.dir, revs...)
		}
		known[r] = oid
	}
	for _, c := range commits {
		oid, ok := strings.CutSuffix(c, "^{commit}")
		if !ok || !isOID(oid) || !slices.Contains(slices.Collect(maps.Values(known)), oid) {
			return resolveAll(ctx, wt.dir, revs...)
		}
		known[c] = oid
	}
	return known, nil
}

// currentBranch is the branch checked out in the worktree, empty when its
// HEAD is detached.
func (wt worktree) currentBranch(ctx context.Context) string {
	if wt.own != "" {
		if b, _, err := worktreeHead(wt.own, wt.gitDir); err == nil {
			return b
		}
	}
	return currentBranch(ctx, wt.dir)
}

// setBase points the worktree's baseRef at oid.
func (wt worktree) setBase(ctx context.Context, oid string) error {
	if wt.own != "" && isOID(oid) {
		return writeWorktreeRef(wt.own, baseRef, oid)
	}
	_, err := git(ctx, wt.dir, "update-ref", baseRef, oid)
	return err
}

// holderOf is holder read from the clone's worktree records, as git
// worktree list reads them: worktrees/<name>/HEAD names the branch a
// worktree has checked out, worktrees/<name>/gitdir the .git file in its
// directory. The clone itself is bare and has none checked out.
func holderOf(gitDir, branch, dir string) (string, error) {
	records := filepath.Join(gitDir, "worktrees")
	entries, err := os.ReadDir(records)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", errRefsUnknown
	}
	for _, e := range entries {
		rec := filepath.Join(records, e.Name())
		target, err := readRefOnce(rec, "HEAD")
		if err != nil {
			return "", err
		}
		if target != "ref: refs/heads/"+branch {
			continue
		}
		b, err := os.ReadFile(filepath.Join(rec, "gitdir"))
		if err != nil {
			return "", errRefsUnknown
		}
		dotGit := strings.TrimSpace(string(b))
		if !filepath.IsAbs(dotGit) {
			dotGit = filepath.Join(rec, dotGit)
		}
		return otherThan(filepath.Dir(dotGit), dir), nil
	}
	return "", nil
}

// branchNameOK reports whether git certainly takes name as a branch name
// (git check-ref-format --branch): no component that is empty, starts
// with a dot or ends in .lock; no "..", "@{", control character, space or
// any of ~^:?*[\; not "@", "HEAD" or a name that starts with "-" or ends
// with "/" or ".". It is as strict as git or stricter: false only means
// that git is to be asked.
func branchNameOK(name string) bool {
	if name == "" || name == "@" || name == "HEAD" || name[0] == '-' ||
		strings.HasSuffix(name, "/") || strings.HasSuffix(name, ".") ||
		strings.Contains(name, "..") || strings.Contains(name, "@{") {
		return false
	}
	for _, c := range strings.Split(name, "/") {
		if c == "" || c[0] == '.' || strings.HasSuffix(c, ".lock") {
			return false
		}
	}
	for i := range len(name) {
		if b := name[i]; b < 0x20 || b == 0x7f || strings.IndexByte(" ~^:?*[\\", b) >= 0 {
			return false
		}
	}
	return true
}
