package taskstate_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/taskstate"
	"github.com/orch-dev/orch/services/runner/workspace"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

func run(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// world is a remote and a store: two clones of the remote are two
// runners' worktrees.
type world struct {
	t      testing.TB
	dir    string
	remote string
	store  func(runner string) *taskstate.Store
}

func newWorld(t testing.TB) *world {
	w := &world{t: t, dir: t.TempDir()}
	w.remote = filepath.Join(w.dir, "remote")
	os.MkdirAll(w.remote, 0o755)
	run(t, w.remote, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(w.remote, "README.md"), []byte("hi\n"), 0o644)
	run(t, w.remote, "add", "README.md")
	run(t, w.remote, "commit", "-q", "-m", "initial")
	js, _ := natstest.JetStream(t)
	obj, err := proto.EnsureObjectStore(context.Background(), js, proto.Topology{}.TaskStateStore())
	if err != nil {
		t.Fatal(err)
	}
	w.store = func(runner string) *taskstate.Store {
		return &taskstate.Store{Obj: obj, Runner: runner, TempDir: w.dir}
	}
	return w
}

// commit makes a commit in pl's worktree that no remote has.
func (w *world) commit(pl taskstate.Place) {
	os.WriteFile(filepath.Join(pl.Worktree, "work.txt"), []byte("work\n"), 0o644)
	run(w.t, pl.Worktree, "add", "work.txt")
	run(w.t, pl.Worktree, "commit", "-q", "-m", "unpushed")
}

func (w *world) clone(name string) taskstate.Place {
	dir := filepath.Join(w.dir, name, "wt")
	run(w.t, w.dir, "clone", "-q", w.remote, dir)
	run(w.t, dir, "checkout", "-q", "-b", "agent/t1")
	return taskstate.Place{Project: "acme", Task: "t1", Worktree: dir, ClaudeDir: filepath.Join(w.dir, name, "home", ".claude")}
}

// Commits whose history the restoring clone lacks (its fetch is older
// than the saving one's) make the state unreadable: the worktree is left
// as it was.
func TestRestoreMissingHistory(t *testing.T) {
	w := newWorld(t)
	b := w.clone("b") // before the remote's next commit
	os.WriteFile(filepath.Join(w.remote, "new.txt"), []byte("new\n"), 0o644)
	run(t, w.remote, "add", "new.txt")
	run(t, w.remote, "commit", "-q", "-m", "on the remote")
	a := w.clone("a")
	w.commit(a)
	ctx := context.Background()
	m, err := w.store("A").Save(ctx, a, "")
	if err != nil || m.Commits != 1 {
		t.Fatalf("save: %+v, %v", m, err)
	}
	before := run(t, b.Worktree, "rev-parse", "HEAD")
	_, err = w.store("B").Restore(ctx, b)
	if !errors.Is(err, taskstate.ErrUnreadable) {
		t.Fatalf("restore: %v, want ErrUnreadable", err)
	}
	if after := run(t, b.Worktree, "rev-parse", "HEAD"); after != before || run(t, b.Worktree, "status", "--porcelain") != "" {
		t.Errorf("the worktree changed: head %s (was %s)", after, before)
	}
	// Once B has fetched what A had, the state restores.
	run(t, b.Worktree, "fetch", "-q", "origin")
	res, err := w.store("B").Restore(ctx, b)
	if err != nil || !res.Did || run(t, b.Worktree, "log", "-1", "--format=%s") != "unpushed" {
		t.Errorf("restore after fetch: %+v, %v", res, err)
	}
}

// A state whose files would land outside the worktree (a path with ..,
// or beneath a link) is refused as unreadable.
func TestRestoreRefusesEscapes(t *testing.T) {
	for name, entries := range map[string][]tar.Header{
		"dotdot":       {{Name: "../escaped", Typeflag: tar.TypeReg}},
		"through link": {{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "link/escaped", Typeflag: tar.TypeReg}},
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			b := w.clone("b")
			head := run(t, b.Worktree, "rev-parse", "HEAD")
			var untracked bytes.Buffer
			tw := tar.NewWriter(&untracked)
			for _, h := range entries {
				h.Mode = 0o644
				tw.WriteHeader(&h)
			}
			tw.Close()
			var obj bytes.Buffer
			tw = tar.NewWriter(&obj)
			for _, f := range []struct {
				name string
				data []byte
			}{
				{"manifest.json", []byte(`{"schema":1,"runner":"A","head":"` + head + `","branch":"agent/t1","untracked":1}`)},
				{"untracked.tar", untracked.Bytes()},
			} {
				tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o600, Size: int64(len(f.data)), Typeflag: tar.TypeReg})
				tw.Write(f.data)
			}
			tw.Close()
			if _, err := w.store("A").Obj.PutBytes(context.Background(), proto.TaskStateKey("acme", "t1"), obj.Bytes()); err != nil {
				t.Fatal(err)
			}
			if _, err := w.store("B").Restore(context.Background(), b); !errors.Is(err, taskstate.ErrUnreadable) {
				t.Fatalf("restore: %v, want ErrUnreadable", err)
			}
			if _, err := os.Lstat(filepath.Join(b.Worktree, "..", "escaped")); err == nil {
				t.Error("a file was written outside the worktree")
			}
			if _, err := os.Lstat("/tmp/escaped"); err == nil {
				t.Error("a file was written through the link")
			}
		})
	}
}

// A save of a task that did not change since this store's last save puts
// nothing and bundles nothing again; a change is saved.
func TestSaveUnchanged(t *testing.T) {
	w := newWorld(t)
	a := w.clone("a")
	w.commit(a)
	ctx := context.Background()
	s := w.store("A")
	info := func() string {
		i, err := s.Obj.GetInfo(ctx, proto.TaskStateKey("acme", "t1"))
		if err != nil {
			t.Fatal(err)
		}
		return i.NUID
	}
	if m, err := s.Save(ctx, a, ""); err != nil || m.Unchanged {
		t.Fatalf("first save: %+v, %v", m, err)
	}
	first := info()
	if m, err := s.Save(ctx, a, ""); err != nil || !m.Unchanged || info() != first {
		t.Fatalf("second save: %+v, %v; want unchanged, the object as it was", m, err)
	}
	os.WriteFile(filepath.Join(a.Worktree, "scratch.txt"), []byte("new\n"), 0o644)
	if m, err := s.Save(ctx, a, ""); err != nil || m.Unchanged || m.Untracked != 1 || info() == first {
		t.Fatalf("save after a change: %+v, %v", m, err)
	}
}

// A worktree with nothing to carry keeps no state, and removes an
// earlier one: it would bring back work that is on the remote now.
func TestSaveNothingKeepsNoState(t *testing.T) {
	w := newWorld(t)
	a := w.clone("a")
	ctx := context.Background()
	s := w.store("A")
	gone := func() bool {
		_, err := s.Obj.GetInfo(ctx, proto.TaskStateKey("acme", "t1"))
		return errors.Is(err, jetstream.ErrObjectNotFound)
	}
	if m, err := s.Save(ctx, a, ""); err != nil || !m.Empty || !gone() {
		t.Fatalf("save of a clean worktree: %+v, %v", m, err)
	}
	os.WriteFile(filepath.Join(a.Worktree, "scratch.txt"), []byte("new\n"), 0o644)
	if m, err := s.Save(ctx, a, ""); err != nil || m.Empty || gone() {
		t.Fatalf("save of a change: %+v, %v", m, err)
	}
	os.Remove(filepath.Join(a.Worktree, "scratch.txt"))
	if m, err := s.Save(ctx, a, ""); err != nil || !m.Empty || !gone() {
		t.Fatalf("save once the change is gone: %+v, %v; want the state deleted", m, err)
	}
}

// A worktree its caller found pristine is saved without git (none is on
// PATH for it), as git would have seen it: nothing to keep but the
// agent's session.
func TestSavePristine(t *testing.T) {
	w := newWorld(t)
	a := w.clone("a")
	ctx := context.Background()
	byGit, err := w.store("A").Save(ctx, a, "")
	if err != nil || !byGit.Empty {
		t.Fatalf("save of a clean worktree: %+v, %v", byGit, err)
	}
	pl := a
	pl.Pristine = &taskstate.Pristine{Head: run(t, a.Worktree, "rev-parse", "HEAD"), Branch: "agent/t1"}
	t.Setenv("PATH", t.TempDir())
	m, err := w.store("B").Save(ctx, pl, "")
	if err != nil || !m.Empty || m.Head != byGit.Head || m.Branch != byGit.Branch || m.Commits != 0 {
		t.Fatalf("pristine save: %+v, %v; want as git saw it: %+v", m, err, byGit)
	}
	sdir := taskstate.SessionDir(a.ClaudeDir, a.Worktree)
	os.MkdirAll(sdir, 0o755)
	os.WriteFile(filepath.Join(sdir, "s1.jsonl"), []byte("{}\n"), 0o644)
	if m, err = w.store("B").Save(ctx, pl, "s1"); err != nil || m.Empty || !m.Session || m.SessionID != "s1" {
		t.Fatalf("pristine save with a session: %+v, %v; want the session kept", m, err)
	}
}

// A fork's pull request head, fetched from origin's refs/pull/<n>/head
// into the clone's workspace.PullRefs, is on origin:
// its commits are not the task's own, and no bundle carries them.
func TestSaveForkPullHead(t *testing.T) {
	w := newWorld(t)
	run(t, w.remote, "checkout", "-q", "-b", "fork")
	os.WriteFile(filepath.Join(w.remote, "fork.txt"), []byte("fork\n"), 0o644)
	run(t, w.remote, "add", "fork.txt")
	run(t, w.remote, "commit", "-q", "-m", "from a fork")
	run(t, w.remote, "update-ref", "refs/pull/1/head", "HEAD")
	run(t, w.remote, "checkout", "-q", "main")
	run(t, w.remote, "branch", "-q", "-D", "fork")
	a := w.clone("a")
	head := workspace.PullRefs + "/1/head"
	run(t, a.Worktree, "fetch", "-q", "origin", "+refs/pull/1/head:"+head)
	run(t, a.Worktree, "checkout", "-q", "-B", "agent/t1", head)
	ctx := context.Background()
	m, err := w.store("A").Save(ctx, a, "")
	if err != nil || m.Commits != 0 {
		t.Fatalf("save on a fork's pull request head: %+v, %v; want no commits of the task's own", m, err)
	}
	w.commit(a)
	if m, err = w.store("A").Save(ctx, a, ""); err != nil || m.Commits != 1 {
		t.Fatalf("save after a commit on it: %+v, %v; want 1 commit", m, err)
	}
}

// Clean removes what a killed runner left, nothing else.
func TestClean(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"taskstate-save-1", "taskstate-restore-2", "taskstate-bundles", "worktrees"} {
		os.MkdirAll(filepath.Join(dir, d, "x"), 0o755)
	}
	if err := (&taskstate.Store{TempDir: dir}).Clean(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "worktrees" {
		t.Errorf("left %v, want only worktrees", entries)
	}
}

// The next job of a task on the runner that saved its state, in the
// worktree still at the saved head, reads no state: the object's info
// says it is still the one this store put. A worktree at another head, or
// a state another runner put since, is read as ever.
func TestRestoreOwnStateReadsNothing(t *testing.T) {
	w := newWorld(t)
	a := w.clone("a")
	w.commit(a)
	ctx := context.Background()
	s := w.store("A")
	if _, err := s.Save(ctx, a, ""); err != nil {
		t.Fatal(err)
	}
	a.Head = run(t, a.Worktree, "rev-parse", "HEAD")
	res, err := s.Restore(ctx, a)
	if err != nil || res.Fetched || res.Did || res.Skipped == "" || res.Manifest == nil || res.Manifest.Commits != 1 || res.Manifest.Runner != "A" {
		t.Fatalf("restore into the saving runner's worktree: %+v (manifest %+v), %v; want A's manifest, nothing read or written", res, res.Manifest, err)
	}

	moved := a
	moved.Head = strings.Repeat("0", 40)
	if res, err := s.Restore(ctx, moved); err != nil || !res.Fetched || res.Did {
		t.Fatalf("restore for another head: %+v, %v; want the state read (and the worktree, its own, kept)", res, err)
	}

	b := w.clone("b")
	os.WriteFile(filepath.Join(b.Worktree, "other.txt"), []byte("b's\n"), 0o644)
	if _, err := w.store("B").Save(ctx, b, ""); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Restore(ctx, a); err != nil || !res.Fetched || res.Manifest == nil || res.Manifest.Runner != "B" {
		t.Fatalf("restore after B's save: %+v, %v; want B's state read", res, err)
	}
}

// BenchmarkRestoreOwn is a task's next job on the runner that saved its
// state (a commit and a session of 256 KiB), its worktree at the saved
// head: "known-head" is the dispatch's path (the head from the
// checkout: the object's info only), "head-unknown" the state read and
// the worktree's status taken, as every restore did before.
func BenchmarkRestoreOwn(b *testing.B) {
	w := newWorld(b)
	a := w.clone("a")
	w.commit(a)
	sdir := taskstate.SessionDir(a.ClaudeDir, a.Worktree)
	os.MkdirAll(sdir, 0o700)
	os.WriteFile(filepath.Join(sdir, "s1.jsonl"), bytes.Repeat([]byte("{\"turn\":1}\n"), 256<<10/11), 0o600)
	ctx := context.Background()
	s := w.store("A")
	if _, err := s.Save(ctx, a, "s1"); err != nil {
		b.Fatal(err)
	}
	head := run(b, a.Worktree, "rev-parse", "HEAD")
	for _, c := range []struct {
		name, head string
		fetched    bool
	}{{"known-head", head, false}, {"head-unknown", "", true}} {
		b.Run(c.name, func(b *testing.B) {
			pl := a
			pl.Head = c.head
			for b.Loop() {
				res, err := s.Restore(ctx, pl)
				if err != nil || res.Fetched != c.fetched || res.Did {
					b.Fatalf("%+v, %v", res, err)
				}
			}
		})
	}
}
