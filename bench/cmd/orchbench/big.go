package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/bench/internal/stats"
)

// bigRows is the big-repository bench (-big): a generated repository of
// bigFiles files and bigCommits commits, served as a file:// URL (so git
// transfers objects as from a remote, not by hardlinks). It measures the
// first job of a task (cold: the runner has no clone yet; warm: it has)
// and a job in an existing worktree, each against the same git work done
// by hand, the disk an extra worktree takes, and what partial clone and
// sparse checkout change.
func (b *bench) bigRows(ctx context.Context, t *table) error {
	progress("generating a repository of %d files and %d commits", b.o.bigFiles, b.o.bigCommits)
	t0 := time.Now()
	src, err := project.SetupBig(ctx, b.dir, project.Big{Files: b.o.bigFiles, Commits: b.o.bigCommits})
	if err != nil {
		return err
	}
	gen := time.Since(t0)
	url := "file://" + src
	if b.registry, err = project.Registry(b.dir, url); err != nil {
		return err
	}
	srcSize, err := project.DiskUsage(ctx, src)
	if err != nil {
		return err
	}
	t.add(row{what: fmt.Sprintf("generated repo: %d files, %d commits (git fast-import)", b.o.bigFiles, b.o.bigCommits),
		orch: mib(srcSize), base: gen.Round(time.Millisecond).String(), ratio: "-", target: "-", verdict: "-"})

	n := b.o.bigN
	progress("raw: clone, %d worktrees, spawns", n)
	t0 = time.Now()
	raw, err := newRawGit(ctx, filepath.Join(b.dir, "big-raw"), url, b.agent)
	if err != nil {
		return err
	}
	cloneTook := time.Since(t0)
	cloneSize, err := project.DiskUsage(ctx, raw.gitDir)
	if err != nil {
		return err
	}
	cold, err := raw.dispatch(ctx, "cold", 1, true)
	if err != nil {
		return err
	}
	rawCold := cloneTook + cold[0]
	rawWarm, err := raw.dispatch(ctx, "big", n, true)
	if err != nil {
		return err
	}
	rawOld, err := raw.dispatch(ctx, "big", n, false)
	if err != nil {
		return err
	}
	wtSize, err := project.DiskUsage(ctx, raw.worktree("big-0"), filepath.Join(raw.gitDir, "worktrees", "big-0"))
	if err != nil {
		return err
	}
	if err := b.cloneOptions(ctx, t, url, raw, cloneTook, cloneSize, wtSize); err != nil {
		return err
	}

	progress("orch: gateway and runner on the big repository")
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	if err := b.startRunner(ctx); err != nil {
		return err
	}
	orchCold, err := b.dispatchSeq(ctx, "bigcold", 1)
	if err != nil {
		return err
	}
	orchWarm, err := b.dispatchSeq(ctx, "big", n)
	if err != nil {
		return err
	}
	orchOld, err := b.dispatchSeq(ctx, "big", n)
	if err != nil {
		return err
	}
	ws := filepath.Join(b.dir, "data-runner", "workspace")
	orchWt, err := project.DiskUsage(ctx, filepath.Join(ws, "worktrees", project.Key, "big-0"),
		filepath.Join(ws, "repos", project.Key+".git", "worktrees", "big-0"))
	if err != nil {
		return err
	}

	t.ratio("big: first job, no clone yet: sent -> agent", stats.Ms(orchCold.P50()), "clone+worktree add+spawn "+stats.Ms(rawCold),
		ratio(orchCold.P50(), rawCold), false, 1.5)
	t.ratio(fmt.Sprintf("big: first job of a new task p50 (%d)", n), stats.Ms(orchWarm.P50()),
		"worktree add+spawn "+stats.Ms(stats.Sample(rawWarm).P50()), ratio(orchWarm.P50(), stats.Sample(rawWarm).P50()), false, 1.5)
	extra := orchOld.P50() - stats.Sample(rawOld).P50()
	t.add(row{what: fmt.Sprintf("big: job in an existing worktree p50 (%d)", n), orch: stats.Ms(orchOld.P50()),
		base: "spawn " + stats.Ms(stats.Sample(rawOld).P50()), ratio: deltaMs(extra),
		target: "<= +5 ms", verdict: verdict(extra <= 5*time.Millisecond)})
	t.ratio("big: disk per extra worktree", mib(orchWt), "git worktree add "+mib(wtSize), float64(orchWt)/float64(wtSize), false, 0)
	return nil
}

// cloneOptions measures, by hand, what a partial clone (--filter=blob:none)
// and a sparse checkout (2 % of the files) change against the full clone
// and checkout measured already.
func (b *bench) cloneOptions(ctx context.Context, t *table, url string, full *rawGit, fullClone time.Duration, fullSize, fullWt int64) error {
	dir := filepath.Join(b.dir, "big-partial")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	part := filepath.Join(dir, "p.git")
	t0 := time.Now()
	if _, err := gitRun(ctx, dir, "clone", "--bare", "--quiet", "--filter=blob:none", url, part); err != nil {
		return err
	}
	partClone := time.Since(t0)
	partSize, err := project.DiskUsage(ctx, part)
	if err != nil {
		return err
	}
	var adds []time.Duration
	for i := range 2 {
		t0 = time.Now()
		if _, err := gitRun(ctx, part, "worktree", "add", "--quiet", "--no-track", "-b", fmt.Sprintf("agent/p%d", i), filepath.Join(dir, fmt.Sprintf("w%d", i)), "main"); err != nil {
			return err
		}
		adds = append(adds, time.Since(t0))
	}
	partAfter, err := project.DiskUsage(ctx, part)
	if err != nil {
		return err
	}
	t.ratio("clone time: partial (blob:none) vs full", stats.Ms(partClone), "full "+stats.Ms(fullClone), ratio(partClone, fullClone), false, 0)
	t.ratio("clone size: partial vs full", mib(partSize), "full "+mib(fullSize), float64(partSize)/float64(fullSize), false, 0)
	t.add(row{what: "partial clone: 1st / 2nd worktree add (blobs fetched once)", orch: stats.Ms(adds[0]) + " / " + stats.Ms(adds[1]),
		base: "-", ratio: "-", target: "-", verdict: "-"})
	t.add(row{what: "partial clone size after 2 worktrees", orch: mib(partAfter), base: "-", ratio: "-", target: "-", verdict: "-"})

	sparse := full.worktree("sparse")
	t0 = time.Now()
	for _, args := range [][]string{
		{"-C", full.gitDir, "worktree", "add", "--quiet", "--no-checkout", "--no-track", "-b", "agent/sparse", sparse, "main"},
		{"-C", sparse, "sparse-checkout", "set", "--cone", "dir000"},
		{"-C", sparse, "checkout", "--quiet"},
	} {
		if _, err := gitRun(ctx, dir, args...); err != nil {
			return err
		}
	}
	sparseTook := time.Since(t0)
	sparseSize, err := project.DiskUsage(ctx, sparse, filepath.Join(full.gitDir, "worktrees", "sparse"))
	if err != nil {
		return err
	}
	full.mu.Lock()
	defer full.mu.Unlock()
	t0 = time.Now()
	wt := full.worktree("timed-full")
	if _, err := gitRun(ctx, dir, "-C", full.gitDir, "worktree", "add", "--quiet", "--no-track", "-b", "agent/timed-full", wt, "main"); err != nil {
		return err
	}
	fullTook := time.Since(t0)
	t.ratio(fmt.Sprintf("worktree add: sparse (1 dir of %d) vs full", (b.o.bigFiles+499)/500), stats.Ms(sparseTook), "full "+stats.Ms(fullTook), ratio(sparseTook, fullTook), false, 0)
	t.ratio("worktree disk: sparse vs full", mib(sparseSize), "full "+mib(fullWt), float64(sparseSize)/float64(fullWt), false, 0)
	return nil
}

// dispatchSeq sends n new-task webhooks (tasks <prefix>-<i>, again for
// the same prefix) one at a time, each after the last one's agent has
// started, and returns webhook sent -> agent started.
func (b *bench) dispatchSeq(ctx context.Context, prefix string, n int) (stats.Sample, error) {
	ds, ns, err := newTaskDeliveries(prefix, n)
	if err != nil {
		return nil, err
	}
	var lat stats.Sample
	for i := range ds {
		l, err := b.dispatch(ctx, []gitea.Delivery{ds[i]}, []int{ns[i]})
		if err != nil {
			return nil, err
		}
		lat = append(lat, l...)
	}
	return lat, nil
}
