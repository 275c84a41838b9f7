// Package taskstate carries a task's work and its agent's session from
// one runner to the next through the JetStream object store
// proto.ObjectStoreTaskState: what exists only on the disk of the runner
// that last ran the task. One object per task (proto.TaskStateKey) is a
// tar of
//
//   - manifest.json: the Manifest (the commit it was saved at, by which
//     runner, when, what it holds);
//   - commits.bundle: the worktree's commits that are on no remote branch
//     (a git bundle of HEAD ^<remote refs>), when there are any;
//   - changes.diff: the uncommitted changes to tracked files (git diff
//     --binary HEAD, staged and not);
//   - untracked.tar: the untracked files git does not ignore;
//   - session.tar: the agent's sessions for the worktree (Claude Code's
//     <config dir>/projects/<the worktree as it names it>/).
//
// Save writes it; Restore brings it back into another runner's worktree
// (the session under that worktree's name) when that worktree lacks it.
// Both run git with GIT_OPTIONAL_LOCKS=0, so a save while the agent works
// never takes the index lock from under it.
package taskstate

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// ErrUnreadable is wrapped by Restore's error when the saved state cannot
// be read: a corrupt object, a manifest that does not parse, commits
// whose history is missing here.
var ErrUnreadable = errors.New("saved task state cannot be read")

// Schema is the version of the object's layout.
const Schema = 1

// Entries of the object's tar.
const (
	entryManifest  = "manifest.json"
	entryCommits   = "commits.bundle"
	entryChanges   = "changes.diff"
	entryUntracked = "untracked.tar"
	entrySession   = "session.tar"
)

// Manifest says what a saved state holds.
type Manifest struct {
	Schema  int       `json:"schema"`
	Project string    `json:"project"`
	Task    string    `json:"task"`
	Runner  string    `json:"runner"`
	SavedAt time.Time `json:"saved_at"`
	// Worktree is the saving runner's worktree path.
	Worktree string `json:"worktree"`
	// Head is the commit the worktree was at; Branch the branch it was on.
	Head   string `json:"head"`
	Branch string `json:"branch,omitempty"`
	// Commits counts the commits of the bundle: HEAD's that are on no
	// remote branch.
	Commits int `json:"commits"`
	// Changes says uncommitted changes of tracked files were saved;
	// Untracked counts the untracked files saved.
	Changes   bool `json:"changes"`
	Untracked int  `json:"untracked"`
	// Omitted says why the uncommitted changes and untracked files were
	// left out (over the size bound); empty when they were not.
	Omitted string `json:"omitted,omitempty"`
	// SessionID is the agent's last session; Session says its directory
	// was saved.
	SessionID string `json:"session_id,omitempty"`
	Session   bool   `json:"session"`
	// Bytes is the object's size, as read from the store (not written
	// into the object itself).
	Bytes int64 `json:"-"`
	// Unchanged says Save put nothing: the state is what this store
	// last saved of the task.
	Unchanged bool `json:"-"`
	// Empty says there was nothing to carry: no object is kept.
	Empty bool `json:"-"`
}

// Place is where a task's state lives on this runner.
type Place struct {
	Project, Task string
	// Worktree is the task's worktree.
	Worktree string
	// ClaudeDir is Claude Code's configuration directory for the task's
	// agent: CLAUDE_CONFIG_DIR, else the agent's $HOME/.claude.
	ClaudeDir string
	// Head is the worktree's HEAD as the caller read it, "" when it did
	// not: Restore reads no state this store saved at that head.
	Head string
	// Pristine, when set, says the caller has just found the worktree
	// holding nothing of its own, without git (workspace's Pristine): at
	// this HEAD and branch, no commit that no remote has, nothing
	// uncommitted or untracked. Save then runs no git process.
	Pristine *Pristine
}

// Pristine is a worktree's HEAD and branch ("" when detached), found
// holding nothing of its own.
type Pristine struct{ Head, Branch string }

func (p Place) key() string { return proto.TaskStateKey(p.Project, p.Task) }

// Store saves and restores task states.
type Store struct {
	// Obj is the object store proto.ObjectStoreTaskState.
	Obj jetstream.ObjectStore
	// Runner is this runner's name, written into every manifest.
	Runner string
	// MaxBytes bounds a state: past it the uncommitted changes and
	// untracked files are left out. Zero is no bound.
	MaxBytes int64
	// TempDir holds the state while it is built or read, and the last
	// bundle of each task (memo.go); "" is the system's.
	TempDir string

	memo memo
}

// Save writes the state of the task at pl: the commits, the changes
// (unless they would take it past MaxBytes), the session directory.
// sessionID is the agent's session, if it reported one; else the newest
// transcript in the directory names it.
func (s *Store) Save(ctx context.Context, pl Place, sessionID string) (Manifest, error) {
	m := Manifest{Schema: Schema, Project: pl.Project, Task: pl.Task, Runner: s.Runner, SavedAt: time.Now().UTC(), Worktree: pl.Worktree}
	tmp, err := os.MkdirTemp(s.TempDir, "taskstate-save-")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(tmp)
	wt := pl.Worktree
	var st wtStatus
	if pr := pl.Pristine; pr != nil {
		st.head, st.branch = pr.Head, pr.Branch
	} else {
		if st, err = readStatus(ctx, wt); err != nil {
			return m, err
		}
		// The commits no remote has (onOrigin).
		count, err := git(ctx, wt, append([]string{"rev-list", "--count", "HEAD"}, notOnOrigin()...)...)
		if err != nil {
			return m, fmt.Errorf("counting unpushed commits: %w", err)
		}
		fmt.Sscan(count, &m.Commits)
	}
	m.Head, m.Branch = st.head, st.branch
	files := map[string]string{}
	if m.Commits > 0 {
		tip, err := tipOf(ctx, wt, m.Head)
		if err != nil {
			return m, fmt.Errorf("reading the remote refs: %w", err)
		}
		path, err := s.bundle(ctx, pl.key(), wt, tip)
		if err != nil {
			return m, err
		}
		files[entryCommits] = path
	}

	sdir := SessionDir(pl.ClaudeDir, wt)
	m.SessionID = sessionID
	if m.SessionID == "" {
		m.SessionID = latestSession(sdir)
	}
	if _, err := os.Stat(sdir); err == nil {
		path := filepath.Join(tmp, entrySession)
		if err := tarDir(path, sdir); err != nil {
			return m, fmt.Errorf("archiving the agent's session: %w", err)
		}
		files[entrySession] = path
		m.Session = true
	}

	changes, untracked, n, err := s.changes(ctx, wt, tmp, st)
	if err != nil {
		return m, err
	}
	if s.MaxBytes > 0 && size(files)+size(changes)+size(untracked) > s.MaxBytes {
		m.Omitted = fmt.Sprintf("the uncommitted changes and untracked files (%d bytes) would take the saved state over ORCH_TASK_STATE_MAX_BYTES (%d bytes): only the commits and the session were saved",
			size(changes)+size(untracked), s.MaxBytes)
	} else {
		maps(files, changes)
		maps(files, untracked)
		m.Changes, m.Untracked = len(changes) > 0, n
	}

	digest, err := digestOf(m, files)
	if err != nil {
		return m, err
	}
	if len(files) == 0 {
		// Nothing to carry (no commits of its own, no changes, no
		// session): no object, and none of an earlier state either.
		digest = "none"
	}
	if l := s.memo.get(pl.key()); l.digest == digest {
		// Nothing changed since this store's last save of the task.
		m.Unchanged = true
		return m, nil
	}
	if len(files) == 0 {
		if err := s.Obj.Delete(ctx, pl.key()); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return m, fmt.Errorf("deleting the task's earlier state: %w", err)
		}
		l := s.memo.get(pl.key())
		l.digest, l.saved, l.nuid = digest, nil, ""
		s.memo.set(pl.key(), l)
		m.Empty = true
		return m, nil
	}

	obj := filepath.Join(tmp, "state.tar")
	if err := writeObject(obj, &m, files); err != nil {
		return m, fmt.Errorf("writing the state: %w", err)
	}
	f, err := os.Open(obj)
	if err != nil {
		return m, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		m.Bytes = fi.Size()
	}
	info, err := s.Obj.Put(ctx, jetstream.ObjectMeta{Name: pl.key(), Description: "orch task state of " + pl.Project + "/" + pl.Task + " by " + s.Runner}, f)
	if err != nil {
		return m, fmt.Errorf("putting the state into %s: %w", proto.ObjectStoreTaskState, err)
	}
	saved := m
	l := s.memo.get(pl.key())
	l.digest, l.saved, l.nuid = digest, &saved, info.NUID
	s.memo.set(pl.key(), l)
	return m, nil
}

// changes writes the worktree's uncommitted changes of tracked files and
// its untracked files (those git does not ignore), as st found them, into
// tmp.
func (s *Store) changes(ctx context.Context, wt, tmp string, st wtStatus) (diff, untracked map[string]string, n int, err error) {
	diff, untracked = map[string]string{}, map[string]string{}
	if st.tracked {
		path := filepath.Join(tmp, entryChanges)
		if err := gitTo(ctx, wt, path, "diff", "--binary", "--no-color", "--no-ext-diff", "HEAD"); err != nil {
			return nil, nil, 0, fmt.Errorf("diffing uncommitted changes: %w", err)
		}
		if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
			diff[entryChanges] = path
		}
	}
	if len(st.untracked) > 0 {
		path := filepath.Join(tmp, entryUntracked)
		if err := tarFiles(path, wt, st.untracked); err != nil {
			return nil, nil, 0, fmt.Errorf("archiving untracked files: %w", err)
		}
		untracked[entryUntracked] = path
	}
	return diff, untracked, len(st.untracked), nil
}

// writeObject writes the object's tar: the manifest, then the files.
func writeObject(out string, m *Manifest, files map[string]string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	mj := manifestJSON(m)
	if err := writeEntry(tw, entryManifest, strings.NewReader(string(mj)), int64(len(mj))); err != nil {
		return err
	}
	for _, name := range []string{entryCommits, entryChanges, entryUntracked, entrySession} {
		p, ok := files[name]
		if !ok {
			continue
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		fi, err := src.Stat()
		if err == nil {
			err = writeEntry(tw, name, src, fi.Size())
		}
		src.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func manifestJSON(m *Manifest) []byte {
	b, _ := json.Marshal(m)
	return b
}

func writeEntry(tw *tar.Writer, name string, r io.Reader, n int64) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: n, Typeflag: tar.TypeReg, ModTime: time.Now()}); err != nil {
		return err
	}
	_, err := io.CopyN(tw, r, n)
	return err
}

// Delete removes the task's state; a task without one is not an error.
func (s *Store) Delete(ctx context.Context, project, task string) error {
	s.memo.drop(proto.TaskStateKey(project, task))
	err := s.Obj.Delete(ctx, proto.TaskStateKey(project, task))
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("deleting the task's state: %w", err)
	}
	return nil
}

func size(files map[string]string) int64 {
	var n int64
	for _, p := range files {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func maps(dst, src map[string]string) {
	for k, v := range src {
		dst[k] = v
	}
}

// onOrigin are the refs whose commits are on origin, where another
// runner fetches them the same way: the remote-tracking branches and the
// fetched heads of forks' pull requests (workspace.PullRefs). A task's
// own commits are those of its HEAD that none of them reaches; they are
// what a save counts and bundles.
var onOrigin = []string{"refs/remotes", workspace.PullRefs}

// notOnOrigin is git's revision arguments for "none of onOrigin".
func notOnOrigin() []string {
	args := []string{"--not"}
	for _, r := range onOrigin {
		args = append(args, "--glob="+r+"/*")
	}
	return args
}

// gitEnv keeps git from taking optional locks: the agent may be running
// git in the same worktree while a periodic save reads it.
var gitEnv = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0", "GIT_TERMINAL_PROMPT=0")

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir, cmd.Env = dir, gitEnv
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimRight(string(out), "\n"), nil
}

func gitTo(ctx context.Context, dir, out string, args ...string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir, cmd.Env, cmd.Stdout = dir, gitEnv, f
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return f.Close()
}
