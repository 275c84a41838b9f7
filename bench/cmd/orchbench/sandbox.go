package main

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/orch-dev/orch/bench/internal/stats"
)

// sandboxRows puts what confinement costs a dispatch side by side: the
// same n jobs of tasks whose worktree exists (at head, the dispatch
// phase's), through a runner whose agents run unconfined
// (ORCH_AGENT_SANDBOX=none) and one whose agents bubblewrap confines
// (bwrap, with the allowlist network and its egress proxy). The runner
// is left confined, as the default (auto) runs it where bwrap works.
func (b *bench) sandboxRows(ctx context.Context, t *table, head string) error {
	const what = "dispatch p50, worktree exists: confined (bwrap)"
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.add(row{what: what, orch: "n/a", base: "no bwrap on PATH", ratio: "-", target: "<= +10 ms", verdict: "-"})
		return nil
	}
	n := b.o.dispatchN
	run := func(mode string) (stats.Sample, error) {
		if err := b.stop("runner"); err != nil {
			return nil, err
		}
		if err := b.startRunnerWith(ctx, "ORCH_AGENT_SANDBOX="+mode); err != nil {
			return nil, fmt.Errorf("runner with ORCH_AGENT_SANDBOX=%s: %w", mode, err)
		}
		ds, ns, err := branchDeliveries("dispatch", n, head)
		if err != nil {
			return nil, err
		}
		return b.dispatch(ctx, ds, ns)
	}
	progress("dispatch of %d tasks whose worktree exists, unconfined then confined", n)
	open, err := run("none")
	if err != nil {
		return err
	}
	confined, err := run("bwrap")
	if err != nil {
		return err
	}
	extra := confined.P50() - open.P50()
	t.add(row{what: what, orch: stats.Ms(confined.P50()), base: "unconfined " + stats.Ms(open.P50()),
		ratio: deltaMs(extra), target: "<= +10 ms", verdict: verdict(extra <= 10*time.Millisecond)})
	t.ratio("dispatch p99, worktree exists: confined", stats.Ms(confined.P99()), "unconfined "+stats.Ms(open.P99()),
		ratio(confined.P99(), open.P99()), false, 0)
	return nil
}
