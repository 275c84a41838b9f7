package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/taskstate"
)

// taskStateReps is how often each save and restore is measured.
const taskStateReps = 3

// taskStateRows measure what carrying a task's state costs (package
// taskstate, the object store task_state on the bench's fsyncing
// server): a save (the unpushed commits bundled, the changes diffed and
// archived, the object put) against `git bundle create` of the same refs,
// and a restore into another clone (the object got, the bundle unbundled,
// the worktree moved to its head) against `git bundle unbundle` of the
// same bundle. Once for a task with a 50 MiB change set (incompressible
// files in unpushed commits, as an agent's generated assets would be),
// once for a task of a few commits in the big repository.
func (b *bench) taskStateRows(ctx context.Context, t *table) error {
	obj, err := proto.EnsureObjectStore(ctx, b.js, proto.Topology{}.TaskStateStore())
	if err != nil {
		return err
	}
	progress("task state: a 50 MiB change set")
	small := filepath.Join(b.dir, "ts-remote")
	if err := testkit.Repo(small); err != nil {
		return err
	}
	if err := b.taskStateCase(ctx, t, obj, "50 MiB change set", small, func(wt string) error {
		for i := range 50 {
			data := make([]byte, 1<<20)
			_, _ = rand.Read(data)
			if err := os.WriteFile(filepath.Join(wt, fmt.Sprintf("asset-%02d.bin", i)), data, 0o644); err != nil {
				return err
			}
		}
		return commitAll(ctx, wt, "change set")
	}); err != nil {
		return err
	}

	progress("task state: the big repository (%d files, %d commits)", b.o.bigFiles, b.o.bigCommits)
	big, err := project.SetupBig(ctx, filepath.Join(b.dir, "ts-big"), project.Big{Files: b.o.bigFiles, Commits: b.o.bigCommits})
	if err != nil {
		return err
	}
	return b.taskStateCase(ctx, t, obj, fmt.Sprintf("big repository (%d files), 5 commits and changes", b.o.bigFiles), "file://"+big, func(wt string) error {
		for i := range 5 {
			if err := os.WriteFile(filepath.Join(wt, fmt.Sprintf("agent-%d.txt", i)), []byte(strings.Repeat("line\n", 1000)), 0o644); err != nil {
				return err
			}
			if err := commitAll(ctx, wt, fmt.Sprintf("agent commit %d", i)); err != nil {
				return err
			}
		}
		// Uncommitted: one new file, which the save's diff and status
		// walk the whole tree to find.
		return os.WriteFile(filepath.Join(wt, "scratch.txt"), []byte("not yet committed\n"), 0o644)
	})
}

// taskStateCase measures one case: change makes the task's work in the
// saving runner's worktree, a clone of remote.
func (b *bench) taskStateCase(ctx context.Context, t *table, obj jetstream.ObjectStore, what, remote string, change func(wt string) error) error {
	root, err := os.MkdirTemp(b.dir, "ts-case-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	clone := func(name string) (string, error) {
		wt := filepath.Join(root, name, "wt")
		if err := tsGit(ctx, root, "clone", "--quiet", remote, wt); err != nil {
			return "", err
		}
		return wt, tsGit(ctx, wt, "checkout", "--quiet", "-b", "agent/bench")
	}
	a, err := clone("a")
	if err != nil {
		return err
	}
	if err := change(a); err != nil {
		return err
	}
	place := func(wt string) taskstate.Place {
		return taskstate.Place{Project: "bench", Task: "carry", Worktree: wt, ClaudeDir: filepath.Join(filepath.Dir(wt), ".claude")}
	}
	bundle := filepath.Join(root, "baseline.bundle")
	var save, again, bundleCreate, restore, unbundle stats.Sample
	var size int64
	for i := range taskStateReps {
		// A store of its own per save: one that saved the task already
		// keeps its bundle and puts nothing when nothing changed (the
		// second save, as a periodic one of an idle agent).
		store := &taskstate.Store{Obj: obj, Runner: "bench-a", TempDir: root}
		t0 := time.Now()
		m, err := store.Save(ctx, place(a), "")
		if err != nil {
			return err
		}
		save = append(save, time.Since(t0))
		size = m.Bytes
		t0 = time.Now()
		if m, err := store.Save(ctx, place(a), ""); err != nil || !m.Unchanged {
			return fmt.Errorf("task state bench: a second save: %+v, %v", m, err)
		}
		again = append(again, time.Since(t0))
		t0 = time.Now()
		if err := tsGit(ctx, a, "bundle", "create", "--quiet", bundle, "HEAD", "--not", "--remotes"); err != nil {
			return err
		}
		bundleCreate = append(bundleCreate, time.Since(t0))

		// Each restore goes into a clone of its own, made untimed: one
		// that already has the objects would not unbundle them.
		bwt, err := clone(fmt.Sprintf("b%d", i))
		if err != nil {
			return err
		}
		cwt, err := clone(fmt.Sprintf("c%d", i))
		if err != nil {
			return err
		}
		restorer := &taskstate.Store{Obj: obj, Runner: "bench-b", TempDir: root}
		t0 = time.Now()
		res, err := restorer.Restore(ctx, place(bwt))
		if err != nil {
			return err
		}
		if !res.Did {
			return fmt.Errorf("task state bench: nothing restored (%s)", res.Skipped)
		}
		restore = append(restore, time.Since(t0))
		t0 = time.Now()
		if err := tsGit(ctx, cwt, "bundle", "unbundle", bundle); err != nil {
			return err
		}
		unbundle = append(unbundle, time.Since(t0))
	}
	t.ratio(fmt.Sprintf("task state save, %s (%s object), vs git bundle create", what, mib(size)),
		stats.Ms(save.P50()), stats.Ms(bundleCreate.P50()), ratio(save.P50(), bundleCreate.P50()), false, 0)
	t.ratio(fmt.Sprintf("task state save again, unchanged, %s, vs git bundle create", what),
		stats.Ms(again.P50()), stats.Ms(bundleCreate.P50()), ratio(again.P50(), bundleCreate.P50()), false, 0)
	t.ratio(fmt.Sprintf("task state restore, %s, vs git bundle unbundle", what),
		stats.Ms(restore.P50()), stats.Ms(unbundle.P50()), ratio(restore.P50(), unbundle.P50()), false, 0)
	return obj.Delete(ctx, proto.TaskStateKey("bench", "carry"))
}

// tsGit runs git in dir, as the bench's identity.
func tsGit(ctx context.Context, dir string, args ...string) error {
	_, err := gitRun(ctx, dir, append([]string{"-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "commit.gpgsign=false"}, args...)...)
	return err
}

// commitAll commits every change in the worktree dir.
func commitAll(ctx context.Context, dir, msg string) error {
	if err := tsGit(ctx, dir, "add", "--all"); err != nil {
		return err
	}
	return tsGit(ctx, dir, "commit", "--quiet", "-m", msg)
}
