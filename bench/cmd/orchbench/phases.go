package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/bench/internal/stats"
)

// tasks spreads jobs over this many tasks: enough that the runner's
// one-job-per-task rule never limits concurrency, few enough that
// worktrees are reused as they are in real use.
const tasks = 64

// all runs every phase in an order that keeps them apart: the queue is
// empty for the first GET /queue figures, the runner is stopped before
// intake so that it takes no CPU from the gateway, and the deep queue is
// filled last.
func (b *bench) all(ctx context.Context, t *table) error {
	log := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "orchbench: "+f+"\n", a...) }
	log("starting gateway, runner (concurrency %d), notifier", b.o.concurrency)
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	if err := b.startRunner(ctx); err != nil {
		return err
	}
	if err := b.startNotifier(ctx); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // let start-up garbage settle
	idle := map[string]proc.Memory{}
	for _, name := range proc.Services {
		m, err := b.procs[name].Memory()
		if err != nil {
			return err
		}
		idle[name] = m
	}

	log("GET /queue with 0 jobs")
	q0, err := b.queueLatency(ctx)
	if err != nil {
		return err
	}

	log("pickup/dispatch at %d/s for %v", b.o.rate, b.o.rateFor)
	rawPickup, err := b.rawPickup(ctx)
	if err != nil {
		return err
	}
	pickup, dispatch, err := b.pickup(ctx)
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("pickup p50 at %d/s: accepted -> runner holds job", b.o.rate), stats.Ms(pickup.P50()),
		"publish->consume "+stats.Ms(rawPickup.P50()), ratio(pickup.P50(), rawPickup.P50()), false, 2)
	t.ratio("pickup p99", stats.Ms(pickup.P99()), "publish->consume "+stats.Ms(rawPickup.P99()),
		ratio(pickup.P99(), rawPickup.P99()), false, 0)
	t.ratio("dispatch p50: accepted -> agent process started", stats.Ms(dispatch.P50()),
		"publish->consume "+stats.Ms(rawPickup.P50()), ratio(dispatch.P50(), rawPickup.P50()), false, 0)
	t.ratio("dispatch p99", stats.Ms(dispatch.P99()), "publish->consume "+stats.Ms(rawPickup.P99()),
		ratio(dispatch.P99(), rawPickup.P99()), false, 0)

	log("drain %d jobs at concurrency %d", b.o.drainN, b.o.concurrency)
	rawDrain, err := b.rawDrain(ctx)
	if err != nil {
		return err
	}
	prof := b.profile("runner", "drain")
	drain, err := b.drain(ctx)
	prof.stop()
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("drain, no-op jobs/s at concurrency %d", b.o.concurrency), fmt.Sprintf("%.0f/s", drain),
		fmt.Sprintf("pull+ack %.0f/s", rawDrain), drain/rawDrain, true, 0.8)

	loaded := map[string]proc.Memory{}
	for _, name := range []string{"runner", "notifier"} {
		if loaded[name], err = b.procs[name].Memory(); err != nil {
			return err
		}
		if err := b.stop(name); err != nil {
			return err
		}
	}

	log("intake: %d webhooks, %d concurrent senders", b.o.intakeN, b.o.intakeC)
	rawLat, rawRate, err := b.rawIntake(ctx)
	if err != nil {
		return err
	}
	prof = b.profile("gateway", "intake")
	lat, rate, err := b.intake(ctx)
	prof.stop()
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("intake, signed webhooks/s (%d senders)", b.o.intakeC), fmt.Sprintf("%.0f/s", rate),
		fmt.Sprintf("sync publish %.0f/s", rawRate), rate/rawRate, true, 0.5)
	t.ratio("intake p50", stats.Ms(lat.P50()), "sync publish "+stats.Ms(rawLat.P50()), ratio(lat.P50(), rawLat.P50()), false, 0)
	t.ratio("intake p99", stats.Ms(lat.P99()), "sync publish "+stats.Ms(rawLat.P99()), ratio(lat.P99(), rawLat.P99()), false, 2)
	if loaded["gateway"], err = b.procs["gateway"].Memory(); err != nil {
		return err
	}

	log("filling the queue with %d jobs", b.o.queueN)
	if err := b.fillQueue(ctx); err != nil {
		return err
	}
	qn, err := b.queueLatency(ctx)
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("GET /queue p50, %d queued vs 0", b.o.queueN), stats.Ms(qn.P50()), "at 0: "+stats.Ms(q0.P50()),
		ratio(qn.P50(), q0.P50()), false, 0)
	t.ratio(fmt.Sprintf("GET /queue p99, %d queued vs 0", b.o.queueN), stats.Ms(qn.P99()), "at 0: "+stats.Ms(q0.P99()),
		ratio(qn.P99(), q0.P99()), false, 2)
	deep, err := b.procs["gateway"].Memory()
	if err != nil {
		return err
	}

	for _, name := range proc.Services {
		t.add(row{what: "idle peak RSS, " + name, orch: mib(idle[name].HWM), base: "-", ratio: "-",
			target: "<= 30 MiB", verdict: verdict(idle[name].HWM <= 30<<20)})
	}
	t.add(row{what: "peak RSS under intake, gateway", orch: mib(loaded["gateway"].HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	t.add(row{what: "peak RSS under dispatch+drain, runner", orch: mib(loaded["runner"].HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	t.add(row{what: "peak RSS at end of load, notifier", orch: mib(loaded["notifier"].HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	t.add(row{what: fmt.Sprintf("peak RSS, gateway indexing %d jobs", b.o.queueN), orch: mib(deep.HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	return nil
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// seq numbers deliveries across phases, so that every webhook is a new
// event.
var seq atomic.Int64

func delivery() (gitea.Delivery, int, error) {
	n := int(seq.Add(1))
	d, err := gitea.New(gitea.PR{Number: 1 + n%tasks, Seq: n})
	return d, n, err
}

// send posts one delivery and returns the job id of its 202 answer.
func (b *bench) send(ctx context.Context, d gitea.Delivery, n int) (string, error) {
	req, err := d.Request(b.gateway, n)
	if err != nil {
		return "", err
	}
	resp, err := b.client.Do(req.WithContext(ctx))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("webhook answered %d: %s", resp.StatusCode, body)
	}
	var ans gitea.Accepted
	if err := json.Unmarshal(body, &ans); err != nil || len(ans.Jobs) != 1 {
		return "", fmt.Errorf("webhook answer %s: want one job", body)
	}
	return ans.Jobs[0].ID, nil
}

// pool runs f(i) for i in [0, n), at most c at once, and returns the
// first error.
func pool(n, c int, f func(i int) error) error {
	var g errgroup.Group
	g.SetLimit(c)
	for i := range n {
		g.Go(func() error { return f(i) })
	}
	return g.Wait()
}
