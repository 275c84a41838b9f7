package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/bench/internal/stats"
)

// tasks spreads jobs over this many tasks: enough that the runner's
// one-job-per-task rule never limits concurrency, few enough that
// worktrees are reused as they are in real use.
const tasks = 64

// all runs every phase in an order that keeps them apart: the queue is
// empty for the first GET /queue figures, the runner is stopped before
// intake so that it takes no CPU from the gateway, and the deep queue is
// filled last. Each orch figure is measured right after its baseline.
func (b *bench) all(ctx context.Context, t *table) error {
	progress("starting gateway, runner (concurrency %d), notifier", b.o.concurrency)
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

	progress("GET /queue with 0 jobs")
	q0, err := b.queueLatency(ctx)
	if err != nil {
		return err
	}

	if err := b.dispatchRows(ctx, t); err != nil {
		return err
	}
	if err := b.egressRows(ctx, t); err != nil {
		return err
	}
	if err := b.taskStateRows(ctx, t); err != nil {
		return err
	}

	if err := b.pickupRows(ctx, t); err != nil {
		return err
	}

	if err := b.drainRows(ctx, t); err != nil {
		return err
	}
	if err := b.fairnessRows(ctx, t); err != nil {
		return err
	}

	loaded := map[string]proc.Memory{}
	for _, name := range []string{"runner", "notifier"} {
		if loaded[name], err = b.procs[name].Memory(); err != nil {
			return err
		}
		if err := b.stop(name); err != nil {
			return err
		}
		// The runner was restarted between the phases (confined and
		// not): its peak is the greatest of its processes'.
		loaded[name] = proc.Memory{RSS: loaded[name].RSS, HWM: b.peaks[name]}
	}

	progress("intake (fsync every write): %d webhooks, %d concurrent senders", b.o.intakeN, b.o.intakeC)
	prof := b.profile("gateway", "intake")
	err = b.intakeRows(ctx, t, "fsync always", b.js, b.gateway)
	prof.stop()
	if err != nil {
		return err
	}
	if loaded["gateway"], err = b.procs["gateway"].Memory(); err != nil {
		return err
	}
	progress("intake (server's default sync): %d webhooks, %d concurrent senders", b.o.intakeN, b.o.intakeC)
	if err := b.intakeDefaultSync(ctx, t); err != nil {
		return err
	}

	progress("filling the queue with %d jobs", b.o.queueN)
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
	t.add(row{what: "peak RSS under dispatch+drain, runner (its processes' greatest)", orch: mib(loaded["runner"].HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	t.add(row{what: "peak RSS at end of load, notifier", orch: mib(loaded["notifier"].HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	t.add(row{what: fmt.Sprintf("peak RSS, gateway indexing %d jobs", b.o.queueN), orch: mib(deep.HWM), base: "-", ratio: "-", target: "-", verdict: "-"})
	perJob := float64(deep.RSS-loaded["gateway"].RSS) / float64(b.o.queueN)
	t.add(row{what: "gateway RSS per indexed job", orch: fmt.Sprintf("%.0f B", perJob), base: "-", ratio: "-",
		target: "<= 2048 B", verdict: verdict(perJob <= 2048)})
	return nil
}

// alone runs rows alone (-only), after starting only the services they
// need (starts, in order).
func alone(rows func(context.Context, *table) error, starts ...func(context.Context) error) func(context.Context, *table) error {
	return func(ctx context.Context, t *table) error {
		for _, start := range starts {
			if err := start(ctx); err != nil {
				return err
			}
		}
		return rows(ctx, t)
	}
}

// pickupRows sends new-task webhooks at b.o.rate for b.o.rateFor and
// reports how far the runner falls behind, against raw publish->consume.
func (b *bench) pickupRows(ctx context.Context, t *table) error {
	progress("pickup/dispatch of new tasks at %d/s for %v", b.o.rate, b.o.rateFor)
	rawPickup, err := b.rawPickup(ctx)
	if err != nil {
		return err
	}
	pickup, dispatch, behind, err := b.pickup(ctx)
	if err != nil {
		return err
	}
	t.add(row{what: fmt.Sprintf("new tasks at %d/s: jobs not started when sending ends", b.o.rate), orch: strconv.Itoa(behind),
		base: "-", ratio: "-", target: fmt.Sprintf("<= %d (slots)", b.o.concurrency), verdict: verdict(behind <= b.o.concurrency)})
	t.ratio(fmt.Sprintf("pickup p50 at %d/s: accepted -> runner holds job", b.o.rate), stats.Ms(pickup.P50()),
		"publish->consume "+stats.Ms(rawPickup.P50()), ratio(pickup.P50(), rawPickup.P50()), false, 0)
	t.ratio("pickup p99", stats.Ms(pickup.P99()), "publish->consume "+stats.Ms(rawPickup.P99()),
		ratio(pickup.P99(), rawPickup.P99()), false, 0)
	t.ratio(fmt.Sprintf("dispatch p50 at %d/s: accepted -> agent started", b.o.rate), stats.Ms(dispatch.P50()),
		"publish->consume "+stats.Ms(rawPickup.P50()), ratio(dispatch.P50(), rawPickup.P50()), false, 0)
	t.ratio("dispatch p99", stats.Ms(dispatch.P99()), "publish->consume "+stats.Ms(rawPickup.P99()),
		ratio(dispatch.P99(), rawPickup.P99()), false, 0)
	return nil
}

// intakeOnly runs the intake rows alone (-only intake), with only the
// gateway started.
func (b *bench) intakeOnly(ctx context.Context, t *table) error {
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	if err := b.intakeRows(ctx, t, "fsync always", b.js, b.gateway); err != nil {
		return err
	}
	return b.intakeDefaultSync(ctx, t)
}

// drainRows drains drainN new-task no-op jobs through the runner, against
// the same work done by hand and against raw pull + ack.
func (b *bench) drainRows(ctx context.Context, t *table) error {
	progress("drain %d new-task jobs at concurrency %d", b.o.drainN, b.o.concurrency)
	rawDrain, err := b.rawDrain(ctx)
	if err != nil {
		return err
	}
	rawWork, err := b.rawWorkDrain(ctx, b.raw, "drainwork")
	if err != nil {
		return err
	}
	// The runner confines its agents where bwrap works (auto): the same
	// work with each agent in bwrap's floor is a confined drain's
	// baseline, reported beside the unconfined one; and the same jobs
	// through a runner that does not confine them are the like of the
	// unconfined baseline, reported beside the judged row.
	var rawFloor, open float64
	if b.raw.bwrap, err = exec.LookPath("bwrap"); err == nil {
		rawFloor, err = b.rawWorkDrain(ctx, b.raw, "drainfloor")
		b.raw.bwrap = ""
		if err != nil {
			return err
		}
		if open, err = b.drainWith(ctx, "drainopen-", "ORCH_AGENT_SANDBOX=none"); err != nil {
			return err
		}
	}
	prof := b.profile("runner", "drain")
	drain, err := b.drain(ctx)
	prof.stop()
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("drain, new-task no-op jobs/s at concurrency %d", b.o.concurrency), fmt.Sprintf("%.0f/s", drain),
		fmt.Sprintf("worktree add+agent+ack %.0f/s", rawWork), drain/rawWork, true, 0.9)
	if rawFloor > 0 {
		t.ratio("drain vs the same work with agents in bwrap's floor", fmt.Sprintf("%.0f/s", drain),
			fmt.Sprintf("worktree add+agent in floor+ack %.0f/s", rawFloor), drain/rawFloor, true, 0)
		t.ratio("drain, runner unconfined (ORCH_AGENT_SANDBOX=none)", fmt.Sprintf("%.0f/s", open),
			fmt.Sprintf("worktree add+agent+ack %.0f/s", rawWork), open/rawWork, true, 0)
	}
	t.ratio("drain vs raw pull+ack", fmt.Sprintf("%.0f/s", drain),
		fmt.Sprintf("pull+ack %.0f/s", rawDrain), drain/rawDrain, true, 0)
	return nil
}

// drainWith is drain through a runner restarted with env, then started
// again as it was.
func (b *bench) drainWith(ctx context.Context, prefix string, env ...string) (float64, error) {
	if err := b.stop("runner"); err != nil {
		return 0, err
	}
	if err := b.startRunnerWith(ctx, env...); err != nil {
		return 0, err
	}
	rate, err := b.drainOver(ctx, prefix, project.Key)
	if err != nil {
		return 0, err
	}
	if err := b.stop("runner"); err != nil {
		return 0, err
	}
	return rate, b.startRunner(ctx)
}

// fairProjects are the projects the fairness row spreads its jobs over:
// the bench project first.
var fairProjects = []string{project.Key, "gadgets", "gizmos", "doohickeys"}

// fairnessRows drains drainN new-task no-op jobs of one project, then as
// many spread over four: what fair share across projects (a slot per
// project, the deferrals of jobs whose project holds more slots) costs.
func (b *bench) fairnessRows(ctx context.Context, t *table) error {
	progress("fairness: drain %d jobs of one project, then of %d projects, at concurrency %d", b.o.drainN, len(fairProjects), b.o.concurrency)
	one, err := b.drainOver(ctx, "fair1-", fairProjects[0])
	if err != nil {
		return err
	}
	prof := b.profile("runner", "fairness")
	spread, err := b.drainOver(ctx, "fair4-", fairProjects...)
	prof.stop()
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("drain over %d projects vs one, concurrency %d", len(fairProjects), b.o.concurrency), fmt.Sprintf("%.0f/s", spread),
		fmt.Sprintf("one project %.0f/s", one), spread/one, true, 0.9)
	return nil
}

// dispatchRows measures, one job at a time at a low rate, webhook sent ->
// agent started for new tasks and then for the same tasks again (their
// worktrees exist), each against its raw baseline.
func (b *bench) dispatchRows(ctx context.Context, t *table) error {
	n := b.o.dispatchN
	progress("dispatch of %d new tasks at %d/s, raw worktree add + spawn first", n, b.o.dispatchRate)
	rawNew, err := b.raw.dispatch(ctx, "dispatch", n, true)
	if err != nil {
		return err
	}
	head, err := b.pushBranches(ctx, "dispatch", n)
	if err != nil {
		return err
	}
	ds, ns, err := branchDeliveries("dispatch", n, head)
	if err != nil {
		return err
	}
	prof := b.profile("runner", "dispatch-new")
	orchNew, err := b.dispatch(ctx, ds, ns)
	prof.stop()
	if err != nil {
		return err
	}
	progress("dispatch of %d tasks whose worktree exists, raw spawn first", n)
	rawOld, err := b.raw.dispatch(ctx, "dispatch", n, false)
	if err != nil {
		return err
	}
	if ds, ns, err = branchDeliveries("dispatch", n, head); err != nil {
		return err
	}
	prof = b.profile("runner", "dispatch-existing")
	orchOld, err := b.dispatch(ctx, ds, ns)
	prof.stop()
	if err != nil {
		return err
	}
	floor, err := b.jetStreamFloor(ctx, n)
	if err != nil {
		return err
	}
	// The runner confines its agents where bwrap works (auto): the same
	// spawns in bwrap's floor are what no confined dispatch goes under.
	var rawConfined stats.Sample
	if b.raw.bwrap, err = exec.LookPath("bwrap"); err == nil {
		progress("the same spawns confined in bwrap's floor")
		lat, err := b.raw.dispatch(ctx, "dispatch", n, false)
		b.raw.bwrap = ""
		if err != nil {
			return err
		}
		rawConfined = lat
	}
	t.ratio(fmt.Sprintf("dispatch p50, new task at %d/s: sent -> agent", b.o.dispatchRate), stats.Ms(orchNew.P50()),
		"worktree add+spawn "+stats.Ms(stats.Sample(rawNew).P50()), ratio(orchNew.P50(), stats.Sample(rawNew).P50()), false, 1.5)
	t.ratio("dispatch p99, new task", stats.Ms(orchNew.P99()), "worktree add+spawn "+stats.Ms(stats.Sample(rawNew).P99()),
		ratio(orchNew.P99(), stats.Sample(rawNew).P99()), false, 0)
	extra := orchOld.P50() - stats.Sample(rawOld).P50()
	t.add(row{what: "dispatch p50, worktree exists: sent -> agent", orch: stats.Ms(orchOld.P50()),
		base: "spawn " + stats.Ms(stats.Sample(rawOld).P50()), ratio: deltaMs(extra),
		target: "<= +5 ms", verdict: verdict(extra <= 5*time.Millisecond)})
	t.ratio("dispatch p99, worktree exists", stats.Ms(orchOld.P99()), "spawn "+stats.Ms(stats.Sample(rawOld).P99()),
		ratio(orchOld.P99(), stats.Sample(rawOld).P99()), false, 0)
	above := extra - floor.P50()
	t.add(row{what: "worktree exists, over spawn + JetStream floor", orch: stats.Ms(orchOld.P50()),
		base:  "spawn + 3 fsynced writes " + stats.Ms(stats.Sample(rawOld).P50()+floor.P50()),
		ratio: deltaMs(above), target: "-", verdict: "-"})
	if rawConfined != nil {
		base := rawConfined.P50() + floor.P50()
		t.add(row{what: "worktree exists, over a spawn in bwrap's floor + JetStream floor", orch: stats.Ms(orchOld.P50()),
			base:  "floor spawn " + stats.Ms(rawConfined.P50()) + " + writes " + stats.Ms(floor.P50()),
			ratio: deltaMs(orchOld.P50() - base), target: "-", verdict: "-"})
	}
	if err := b.leastRows(ctx, t, head, orchOld, rawOld); err != nil {
		return err
	}
	return b.sandboxRows(ctx, t, head)
}

// pushBranches makes the head branches agent/<prefix>-<i> of n pull
// requests on the project's repository, at main's head, and returns that
// commit, which the deliveries name as their head as Gitea would. The
// runner's clone learns them with its next fetch: after the first job,
// each job's head is already in the clone, as it is when the branch was
// pushed from the runner's own worktree by an earlier job of the task.
func (b *bench) pushBranches(ctx context.Context, prefix string, n int) (string, error) {
	head, err := b.mainHead(ctx)
	if err != nil {
		return "", err
	}
	for i := range n {
		if err := b.pushBranch(prefix, i, head); err != nil {
			return "", err
		}
	}
	return head, nil
}

// mainHead is the commit at the head of main in the project's repository.
func (b *bench) mainHead(ctx context.Context) (string, error) {
	out, err := gitRun(ctx, filepath.Join(b.dir, "repo"), "rev-parse", "main")
	return strings.TrimSpace(out), err
}

// pushBranch makes the head branch agent/<prefix>-<i> of a pull request
// on the project's repository, at head: it writes the loose ref as git
// does (a file renamed into place, so a fetch never reads half of one),
// without a git process competing with the runner for the CPU while the
// pickup phase pushes a branch a webhook.
func (b *bench) pushBranch(prefix string, i int, head string) error {
	ref := filepath.Join(b.dir, "repo", ".git", "refs", "heads", "agent", fmt.Sprintf("%s-%d", prefix, i))
	if err := os.MkdirAll(filepath.Dir(ref), 0o755); err != nil {
		return err
	}
	tmp := ref + ".lock"
	if err := os.WriteFile(tmp, []byte(head+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, ref)
}

// intakeRows measures intake through the gateway at base against raw
// synchronous publish through js, both on the same server.
func (b *bench) intakeRows(ctx context.Context, t *table, sync string, js jetstream.JetStream, base string) error {
	rawLat, rawRate, err := b.rawIntake(ctx, js)
	if err != nil {
		return err
	}
	minLat, minRate, err := b.minimalIntake(ctx, js)
	if err != nil {
		return err
	}
	procLat, procRate, err := b.minimalProcIntake(ctx, js, false)
	if err != nil {
		return err
	}
	followLat, followRate, err := b.minimalProcIntake(ctx, js, true)
	if err != nil {
		return err
	}
	lat, rate, err := b.intake(ctx, base)
	if err != nil {
		return err
	}
	newLat, newRate, err := b.intakeNew(ctx, base)
	if err != nil {
		return err
	}
	t.ratio(fmt.Sprintf("intake, webhooks/s (%d senders, %s)", b.o.intakeC, sync), fmt.Sprintf("%.0f/s", rate),
		fmt.Sprintf("sync publish %.0f/s", rawRate), rate/rawRate, true, 0.5)
	t.ratio("  minimal gateway (HTTP, HMAC, JSON, publish) in orchbench's process, "+sync, fmt.Sprintf("%.0f/s", minRate),
		fmt.Sprintf("sync publish %.0f/s", rawRate), minRate/rawRate, true, 0)
	t.ratio("  minimal gateway p99 in orchbench's process, "+sync, stats.Ms(minLat.P99()), "sync publish "+stats.Ms(rawLat.P99()), ratio(minLat.P99(), rawLat.P99()), false, 0)
	t.ratio("  minimal gateway, a process of its own as orch's is, "+sync, fmt.Sprintf("%.0f/s", procRate),
		fmt.Sprintf("sync publish %.0f/s", rawRate), procRate/rawRate, true, 0)
	t.ratio("  minimal gateway p99, a process of its own, "+sync, stats.Ms(procLat.P99()), "sync publish "+stats.Ms(rawLat.P99()), ratio(procLat.P99(), rawLat.P99()), false, 0)
	t.ratio("  orch vs the minimal gateway in a process of its own, "+sync, fmt.Sprintf("%.0f/s", rate),
		fmt.Sprintf("minimal %.0f/s", procRate), rate/procRate, true, 0)
	t.ratio("  minimal gateway + a superseded job's record after the answer, own process, "+sync, fmt.Sprintf("%.0f/s", followRate),
		fmt.Sprintf("sync publish %.0f/s", rawRate), followRate/rawRate, true, 0)
	t.ratio("  minimal gateway + those writes p99, own process, "+sync, stats.Ms(followLat.P99()), "sync publish "+stats.Ms(rawLat.P99()), ratio(followLat.P99(), rawLat.P99()), false, 0)
	t.ratio("  orch vs the minimal gateway with those writes, "+sync, fmt.Sprintf("%.0f/s", rate),
		fmt.Sprintf("minimal+writes %.0f/s", followRate), rate/followRate, true, 0)
	t.ratio("intake p50, "+sync, stats.Ms(lat.P50()), "sync publish "+stats.Ms(rawLat.P50()), ratio(lat.P50(), rawLat.P50()), false, 0)
	t.ratio("intake p99, "+sync, stats.Ms(lat.P99()), "sync publish "+stats.Ms(rawLat.P99()), ratio(lat.P99(), rawLat.P99()), false, 2)
	t.ratio("  orch p99 vs the minimal gateway's with those writes, "+sync, stats.Ms(lat.P99()), "minimal+writes "+stats.Ms(followLat.P99()), ratio(lat.P99(), followLat.P99()), false, 0)
	t.ratio("  orch, new pull requests (nothing superseded), "+sync, fmt.Sprintf("%.0f/s", newRate),
		fmt.Sprintf("sync publish %.0f/s", rawRate), newRate/rawRate, true, 0)
	t.ratio("  orch p99, new pull requests, "+sync, stats.Ms(newLat.P99()), "sync publish "+stats.Ms(rawLat.P99()), ratio(newLat.P99(), rawLat.P99()), false, 0)
	return nil
}

// intakeDefaultSync runs the intake rows again on a second server that
// fsyncs on its default schedule, with a second gateway connected to it.
func (b *bench) intakeDefaultSync(ctx context.Context, t *table) error {
	s, err := startServer(ctx, filepath.Join(b.dir, "jetstream-default-sync"), false)
	if err != nil {
		return err
	}
	defer s.close()
	base, err := b.startGatewayAs(ctx, "gateway-default-sync", "ORCH_NATS_URL="+s.srv.URL())
	defer func() { _ = b.stop("gateway-default-sync") }()
	if err != nil {
		return err
	}
	prof := b.profile("gateway-default-sync", "intake")
	defer prof.stop()
	return b.intakeRows(ctx, t, "default sync", s.js, base)
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
	return b.sendTo(ctx, b.gateway, d, n)
}

// sendTo posts one delivery to the gateway at base and returns the job id
// of its 202 answer.
func (b *bench) sendTo(ctx context.Context, base string, d gitea.Delivery, n int) (string, error) {
	req, err := d.Request(base, n)
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
