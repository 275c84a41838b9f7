package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/proto"
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

// --- intake ---

func (b *bench) intakeDeliveries() ([]gitea.Delivery, []int, error) {
	ds := make([]gitea.Delivery, b.o.intakeN)
	ns := make([]int, b.o.intakeN)
	for i := range ds {
		var err error
		if ds[i], ns[i], err = delivery(); err != nil {
			return nil, nil, err
		}
	}
	return ds, ns, nil
}

func (b *bench) rawIntake(ctx context.Context) (stats.Sample, float64, error) {
	if _, err := b.rawStream(ctx, "BENCH_INTAKE", "bench.intake.>"); err != nil {
		return nil, 0, err
	}
	ds, ns, err := b.intakeDeliveries()
	if err != nil {
		return nil, 0, err
	}
	lat := make(stats.Sample, len(ds))
	start := time.Now()
	err = pool(len(ds), b.o.intakeC, func(i int) error {
		t0 := time.Now()
		_, err := b.js.Publish(ctx, "bench.intake.widgets.review", ds[i].Body, jetstream.WithMsgID("intake-"+strconv.Itoa(ns[i])))
		lat[i] = time.Since(t0)
		return err
	})
	return lat, float64(len(ds)) / time.Since(start).Seconds(), err
}

func (b *bench) intake(ctx context.Context) (stats.Sample, float64, error) {
	ds, ns, err := b.intakeDeliveries()
	if err != nil {
		return nil, 0, err
	}
	lat := make(stats.Sample, len(ds))
	start := time.Now()
	err = pool(len(ds), b.o.intakeC, func(i int) error {
		t0 := time.Now()
		_, err := b.send(ctx, ds[i], ns[i])
		lat[i] = time.Since(t0)
		return err
	})
	return lat, float64(len(ds)) / time.Since(start).Seconds(), err
}

// --- pickup and dispatch ---

// paced calls f(i) at rate per second for b.o.rateFor, each call on its
// own goroutine so that a slow answer does not hold back the next.
func (b *bench) paced(f func(i int)) {
	n := int(b.o.rateFor.Seconds() * float64(b.o.rate))
	interval := time.Second / time.Duration(b.o.rate)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

func (b *bench) rawPickup(ctx context.Context) (stats.Sample, error) {
	st, err := b.rawStream(ctx, "BENCH_PICKUP", "bench.pickup.>")
	if err != nil {
		return nil, err
	}
	cfg := proto.RunnerConsumer(b.o.concurrency, 3, 5*time.Second)
	cfg.Durable, cfg.FilterSubject = "raw", ""
	cons, err := st.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var (
		mu  sync.Mutex
		lat stats.Sample
	)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		sent, _ := strconv.ParseInt(string(m.Data()), 10, 64)
		mu.Lock()
		lat = append(lat, now.Sub(time.Unix(0, sent)))
		mu.Unlock()
		_ = m.Ack()
	}, jetstream.PullMaxMessages(b.o.concurrency))
	if err != nil {
		return nil, err
	}
	defer cc.Stop()
	var perr atomic.Pointer[error]
	b.paced(func(i int) {
		if _, err := b.js.Publish(ctx, "bench.pickup.x", []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
			perr.Store(&err)
		}
	})
	if p := perr.Load(); p != nil {
		return nil, *p
	}
	n := int(b.o.rateFor.Seconds() * float64(b.o.rate))
	err = waitFor(ctx, nil, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(lat) < n {
			return fmt.Errorf("%d of %d consumed", len(lat), n)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	return lat, err
}

func (b *bench) pickup(ctx context.Context) (pickup, dispatch stats.Sample, err error) {
	n := int(b.o.rateFor.Seconds() * float64(b.o.rate))
	accepted := make([]time.Time, n)
	ids := make([]string, n)
	ds := make([]gitea.Delivery, n)
	ns := make([]int, n)
	for i := range ds {
		if ds[i], ns[i], err = delivery(); err != nil {
			return nil, nil, err
		}
	}
	var serr atomic.Pointer[error]
	b.paced(func(i int) {
		id, err := b.send(ctx, ds[i], ns[i])
		accepted[i] = time.Now()
		ids[i] = id
		if err != nil {
			serr.Store(&err)
		}
	})
	if p := serr.Load(); p != nil {
		return nil, nil, *p
	}
	var starts map[string]time.Time
	if err := waitFor(ctx, b.procs["runner"], 2*time.Minute, func() error {
		starts, err = readStarts(b.records)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, ok := starts[id]; !ok {
				return fmt.Errorf("%d of %d agents started", len(starts), n)
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	kv, err := b.js.KeyValue(ctx, proto.BucketJobs)
	if err != nil {
		return nil, nil, err
	}
	for i, id := range ids {
		e, err := kv.Get(ctx, id)
		if err != nil {
			return nil, nil, fmt.Errorf("status of %s: %w", id, err)
		}
		st, err := proto.DecodeStatus(e.Value())
		if err != nil {
			return nil, nil, err
		}
		pickup = append(pickup, st.StartedAt.Sub(accepted[i]))
		dispatch = append(dispatch, starts[id].Sub(accepted[i]))
	}
	return pickup, dispatch, nil
}

// readStarts reads the agent's record: the first start of each job.
func readStarts(path string) (map[string]time.Time, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]time.Time{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]time.Time{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			continue
		}
		ns, err := strconv.ParseInt(fs[2], 10, 64)
		if err != nil {
			continue
		}
		if _, ok := out[fs[0]]; !ok {
			out[fs[0]] = time.Unix(0, ns)
		}
	}
	return out, sc.Err()
}

// --- drain ---

// jobMsg is a valid job of the bench project, on its subject with its
// dedupe id.
func jobMsg(id string, i int) (*nats.Msg, []byte, error) {
	job := proto.Job{
		Schema: proto.SchemaVersion, ID: id, Kind: proto.KindReview, Project: project.Key,
		Task:      proto.Task{ID: "t-" + strconv.Itoa(i%tasks), Title: "bench job " + id},
		Source:    proto.Source{System: "api", Actor: "orchbench"},
		CreatedAt: time.Now().UTC(),
	}
	data, err := json.Marshal(job)
	if err != nil {
		return nil, nil, err
	}
	m := nats.NewMsg(proto.JobSubject(job.Project, job.Kind))
	m.Data = data
	m.Header.Set(proto.HeaderMsgID, id)
	st, err := json.Marshal(proto.Status{Schema: proto.SchemaVersion, Job: job, State: proto.StateQueued, UpdatedAt: job.CreatedAt})
	return m, st, err
}

// publishAll publishes msgs asynchronously and waits for every ack.
func (b *bench) publishAll(ctx context.Context, msgs []*nats.Msg) error {
	var futures []jetstream.PubAckFuture
	for _, m := range msgs {
		f, err := b.js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Minute):
		return errors.New("async publish not acked after 5m")
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			return err
		default:
		}
	}
	return nil
}

func (b *bench) rawDrain(ctx context.Context) (float64, error) {
	st, err := b.rawStream(ctx, "BENCH_DRAIN", "bench.drain.>")
	if err != nil {
		return 0, err
	}
	msgs := make([]*nats.Msg, b.o.drainN)
	for i := range msgs {
		m, _, err := jobMsg("drain-raw-"+strconv.Itoa(i), i)
		if err != nil {
			return 0, err
		}
		m.Subject = "bench.drain.x"
		msgs[i] = m
	}
	if err := b.publishAll(ctx, msgs); err != nil {
		return 0, err
	}
	cfg := proto.RunnerConsumer(b.o.concurrency, 3, 5*time.Second)
	cfg.Durable, cfg.FilterSubject = "raw", ""
	cons, err := st.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		return 0, err
	}
	// The same shape as the runner: a serial handler that hands each
	// message to one of concurrency workers, which acks it and waits for
	// the server to confirm.
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		slots = make(chan struct{}, b.o.concurrency)
		first sync.Once
		start time.Time
	)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		first.Do(func() { start = time.Now() })
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := m.DoubleAck(ctx); err == nil {
				done.Add(1)
			}
		})
	}, jetstream.PullMaxMessages(b.o.concurrency))
	if err != nil {
		return 0, err
	}
	var took time.Duration
	err = waitFor(ctx, nil, 5*time.Minute, func() error {
		if n := done.Load(); n < int64(b.o.drainN) {
			return fmt.Errorf("%d of %d acked", n, b.o.drainN)
		}
		took = time.Since(start)
		return nil
	})
	cc.Stop()
	<-cc.Closed()
	wg.Wait()
	return float64(b.o.drainN) / took.Seconds(), err
}

func (b *bench) drain(ctx context.Context) (float64, error) {
	// Pause the runner's consumer while the jobs are published, so that
	// the clock starts with a full queue, as the baseline's does.
	if _, err := b.js.PauseConsumer(ctx, proto.StreamJobs, proto.ConsumerRunner, time.Now().Add(time.Hour)); err != nil {
		return 0, fmt.Errorf("pausing the runner consumer: %w", err)
	}
	msgs := make([]*nats.Msg, b.o.drainN)
	for i := range msgs {
		m, _, err := jobMsg("drain-"+strconv.Itoa(i), i)
		if err != nil {
			return 0, err
		}
		msgs[i] = m
	}
	if err := b.publishAll(ctx, msgs); err != nil {
		return 0, err
	}
	stream, err := b.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return 0, err
	}
	if _, err := b.js.ResumeConsumer(ctx, proto.StreamJobs, proto.ConsumerRunner); err != nil {
		return 0, err
	}
	// The clock runs from the first agent start to the last ack (the
	// stream is a work queue: an acked job leaves it), as the baseline's
	// runs from its first delivery: a paused pull consumer resumes when
	// the client next pulls, which is no part of either.
	var end time.Time
	err = waitFor(ctx, b.procs["runner"], 10*time.Minute, func() error {
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs > 0 {
			return fmt.Errorf("%d jobs left", info.State.Msgs)
		}
		end = time.Now()
		return nil
	})
	if err != nil {
		return 0, err
	}
	starts, err := readStarts(b.records)
	if err != nil {
		return 0, err
	}
	var start time.Time
	for i := range b.o.drainN {
		t, ok := starts["drain-"+strconv.Itoa(i)]
		if !ok {
			return 0, fmt.Errorf("job drain-%d done without an agent start", i)
		}
		if start.IsZero() || t.Before(start) {
			start = t
		}
	}
	return float64(b.o.drainN) / end.Sub(start).Seconds(), nil
}

// --- GET /queue ---

func (b *bench) queueLatency(ctx context.Context) (stats.Sample, error) {
	var lat stats.Sample
	for range b.o.queueGets {
		_, took, err := b.getQueue(ctx)
		if err != nil {
			return nil, err
		}
		lat = append(lat, took)
	}
	return lat, nil
}

// fillQueue queues b.o.queueN jobs the quick way: raw publishes of job
// messages and of their status records, as the gateway would write them,
// then waits until the gateway's index has them all.
func (b *bench) fillQueue(ctx context.Context) error {
	const batch = 1000 // jobs: 2000 messages, within the async publish window
	for off := 0; off < b.o.queueN; off += batch {
		var msgs []*nats.Msg
		for i := off; i < min(off+batch, b.o.queueN); i++ {
			id := "deep-" + strconv.Itoa(i)
			m, st, err := jobMsg(id, i)
			if err != nil {
				return err
			}
			kvm := nats.NewMsg("$KV." + proto.BucketJobs + "." + id)
			kvm.Data = st
			msgs = append(msgs, m, kvm)
		}
		if err := b.publishAll(ctx, msgs); err != nil {
			return err
		}
	}
	return waitFor(ctx, b.procs["gateway"], 2*time.Minute, func() error {
		q, _, err := b.getQueue(ctx)
		if err != nil {
			return err
		}
		if q.Counts["queued"] < b.o.queueN {
			return fmt.Errorf("gateway indexes %d queued jobs", q.Counts["queued"])
		}
		return nil
	})
}
