package taskstate

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
)

// Restored is what Restore found and did.
type Restored struct {
	// Manifest is the saved state's, nil when the task has none.
	Manifest *Manifest
	// Did says the state was written into the worktree; when it was not,
	// Skipped says why (the worktree is the saved one, or holds work of
	// its own).
	Did     bool
	Skipped string
	// Fetched says the state was read from the store; a worktree this
	// store saved, still at its head, needs no read.
	Fetched bool
}

// What says in a phrase what was restored: "2 commits, uncommitted
// changes, 1 untracked file and the agent's session".
func (r Restored) What() string {
	m := r.Manifest
	if m == nil || !r.Did {
		return ""
	}
	var parts []string
	if m.Commits > 0 {
		parts = append(parts, plural(m.Commits, "commit", "commits")+" not on the remote")
	}
	if m.Changes {
		parts = append(parts, "uncommitted changes")
	}
	if m.Untracked > 0 {
		parts = append(parts, plural(m.Untracked, "untracked file", "untracked files"))
	}
	if m.Session {
		parts = append(parts, "the agent's session")
	}
	if len(parts) == 0 {
		return "nothing but the commit it was at"
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// skippedOwn is why a state is not restored into the worktree it was
// saved from.
const skippedOwn = "this runner's worktree is the saved one"

// Restore reads the task's saved state and, unless the worktree at pl
// already is that state (this runner saved it, and the worktree is at the
// same head or keeps its changes) or holds uncommitted work of its own,
// writes it in: the commits (the worktree's
// branch moved to the saved head unless it already contains it), the
// uncommitted changes and untracked files, and the agent's session under
// pl's worktree name. The state is read and checked whole before the
// worktree is touched; should writing it fail halfway, the worktree goes
// back to the head it had. An error wrapping ErrUnreadable means the
// state could not be read and the worktree is as it was.
func (s *Store) Restore(ctx context.Context, pl Place) (Restored, error) {
	return s.RestoreFound(ctx, pl, s.Lookup(ctx, pl.Project, pl.Task))
}

// Found is what Lookup found: the info of the task's saved state, nil
// when it has none.
type Found struct {
	info *jetstream.ObjectInfo
	err  error
}

// Lookup reads the info of the task's saved state, Restore's first read.
// It needs no worktree, so it can go out while the worktree is checked;
// RestoreFound takes its answer.
func (s *Store) Lookup(ctx context.Context, project, task string) Found {
	info, err := s.Obj.GetInfo(ctx, proto.TaskStateKey(project, task))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Found{}
	}
	return Found{info: info, err: err}
}

// RestoreFound is Restore of the state f found, f being Lookup's answer
// for pl's task.
func (s *Store) RestoreFound(ctx context.Context, pl Place, f Found) (Restored, error) {
	switch {
	case f.err != nil:
		return Restored{}, fmt.Errorf("getting the task's state: %w", f.err)
	case f.info == nil:
		return Restored{}, nil
	}
	// The state this store put last, still the object the store holds,
	// of a worktree still at its head: the worktree is the saved one, and
	// the object's info says so without reading the state or the
	// worktree (the next job of a task on the same runner).
	if l := s.memo.get(pl.key()); l.saved != nil && pl.Head != "" && pl.Head == l.saved.Head && f.info.NUID == l.nuid {
		m := *l.saved
		return Restored{Manifest: &m, Skipped: skippedOwn}, nil
	}
	tmp, err := os.MkdirTemp(s.TempDir, "taskstate-restore-")
	if err != nil {
		return Restored{}, err
	}
	defer os.RemoveAll(tmp)
	m, dir, err := s.fetch(ctx, pl, tmp)
	if err != nil || m == nil {
		return Restored{}, err
	}
	res := Restored{Manifest: m, Fetched: true}
	wt := pl.Worktree
	st, err := readStatus(ctx, wt)
	if err != nil {
		return res, err
	}
	head, branch := st.head, st.branch
	// This runner's own worktree, at the saved head or holding its own
	// changes kept since: the state is what it has, or older.
	if m.Runner == s.Runner && (head == m.Head || st.dirty()) {
		res.Skipped = skippedOwn
		return res, nil
	}
	if st.dirty() {
		res.Skipped = "the worktree has uncommitted changes of its own"
		return res, nil
	}
	if m.Branch != "" && branch != m.Branch {
		res.Skipped = fmt.Sprintf("the state was saved on branch %s, the worktree is on %s", m.Branch, branch)
		return res, nil
	}

	// Everything is checked before the worktree changes.
	bundle := filepath.Join(dir, entryCommits)
	if exists(bundle) {
		if _, err := git(ctx, wt, "bundle", "verify", "--quiet", bundle); err != nil {
			return res, fmt.Errorf("%w: its commits: %v", ErrUnreadable, err)
		}
		if _, err := git(ctx, wt, "bundle", "unbundle", bundle); err != nil {
			return res, fmt.Errorf("%w: its commits: %v", ErrUnreadable, err)
		}
	}
	if _, err := git(ctx, wt, "cat-file", "-e", m.Head+"^{commit}"); err != nil {
		return res, fmt.Errorf("%w: its head %s is not here", ErrUnreadable, m.Head)
	}
	target := head
	if _, err := git(ctx, wt, "merge-base", "--is-ancestor", m.Head, head); err != nil {
		target = m.Head // the worktree lacks the saved commits
	}
	diff := filepath.Join(dir, entryChanges)
	hasDiff := exists(diff)

	undo := func(cause error) (Restored, error) {
		_, _ = git(context.WithoutCancel(ctx), wt, "reset", "--hard", "--quiet", head)
		_, _ = git(context.WithoutCancel(ctx), wt, "clean", "-fdq")
		return res, cause
	}
	if target != head {
		if _, err := git(ctx, wt, "reset", "--hard", "--quiet", target); err != nil {
			return undo(fmt.Errorf("moving the worktree to the saved head: %w", err))
		}
	}
	if hasDiff {
		if _, err := git(ctx, wt, "apply", "--check", "--binary", diff); err != nil {
			return undo(fmt.Errorf("%w: its uncommitted changes do not apply: %v", ErrUnreadable, err))
		}
		if _, err := git(ctx, wt, "apply", "--binary", diff); err != nil {
			return undo(fmt.Errorf("applying the uncommitted changes: %w", err))
		}
	}
	if u := filepath.Join(dir, entryUntracked); exists(u) {
		if err := untar(u, wt); err != nil {
			return undo(fmt.Errorf("writing the untracked files: %w", err))
		}
	}
	if sess := filepath.Join(dir, entrySession); exists(sess) {
		if err := untar(sess, SessionDir(pl.ClaudeDir, wt)); err != nil {
			return undo(fmt.Errorf("writing the agent's session: %w", err))
		}
	}
	res.Did = true
	return res, nil
}

// fetch reads the task's object into tmp and unpacks it into tmp/state;
// a nil Manifest when the task has no state.
func (s *Store) fetch(ctx context.Context, pl Place, tmp string) (*Manifest, string, error) {
	obj, err := s.Obj.Get(ctx, pl.key())
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("getting the task's state: %w", err)
	}
	defer obj.Close()
	info, err := obj.Info()
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	dir := filepath.Join(tmp, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, "", err
	}
	// The reader checks the object's digest at its end: a corrupt object
	// fails here, before anything is used.
	tr := tar.NewReader(obj)
	var m *Manifest
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, "", fmt.Errorf("%w: %v", ErrUnreadable, err)
		}
		switch hdr.Name {
		case entryManifest:
			m = new(Manifest)
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(m); err != nil {
				return nil, "", fmt.Errorf("%w: its manifest: %v", ErrUnreadable, err)
			}
		case entryCommits, entryChanges, entryUntracked, entrySession:
			if err := copyTo(filepath.Join(dir, hdr.Name), tr); err != nil {
				return nil, "", fmt.Errorf("%w: %v", ErrUnreadable, err)
			}
		}
	}
	if _, err := io.Copy(io.Discard, obj); err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	if m == nil || m.Schema != Schema || m.Head == "" {
		return nil, "", fmt.Errorf("%w: no manifest of schema %d", ErrUnreadable, Schema)
	}
	m.Bytes = int64(info.Size)
	return m, dir, nil
}

func copyTo(path string, r io.Reader) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
