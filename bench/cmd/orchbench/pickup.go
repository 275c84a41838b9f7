package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/proto"
)

// paced calls f(i) for i in [0, n) at rate per second, each call on its
// own goroutine so that a slow answer does not hold back the next.
func paced(n, rate int, f func(i int)) {
	interval := time.Second / time.Duration(rate)
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
	paced(b.rateN(), b.o.rate, func(i int) {
		if _, err := b.js.Publish(ctx, "bench.pickup.x", []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
			perr.Store(&err)
		}
	})
	if p := perr.Load(); p != nil {
		return nil, *p
	}
	n := b.rateN()
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

// rateN is the number of webhooks of the pickup phase.
func (b *bench) rateN() int { return int(b.o.rateFor.Seconds() * float64(b.o.rate)) }

// sent is what the load driver knows of one webhook it sent.
type sent struct {
	id       string
	sent     time.Time // just before the request
	accepted time.Time // when the 202 was read
}

// sendPaced sends ds to the gateway at base at rate per second and
// returns what it sent, in order. before, when set, runs just before each
// send, outside its time.
func (b *bench) sendPaced(ctx context.Context, base string, ds []gitea.Delivery, ns []int, rate int, before func(i int) error) ([]sent, error) {
	out := make([]sent, len(ds))
	var serr atomic.Pointer[error]
	paced(len(ds), rate, func(i int) {
		if before != nil {
			if err := before(i); err != nil {
				serr.Store(&err)
				return
			}
		}
		t0 := time.Now()
		id, err := b.sendTo(ctx, base, ds[i], ns[i])
		out[i] = sent{id: id, sent: t0, accepted: time.Now()}
		if err != nil {
			serr.Store(&err)
		}
	})
	if p := serr.Load(); p != nil {
		return nil, *p
	}
	return out, nil
}

// waitStarts waits until the agent of every job in ss has started and
// returns the agents' start stamps.
func (b *bench) waitStarts(ctx context.Context, ss []sent) (map[string]time.Time, error) {
	return waitStartsIn(ctx, b.procs["runner"], b.records, ss, nil)
}

// waitStartsIn waits until the agent of every job in ss has left its
// start line in records, and returns the start stamps there; it gives up
// when p exits (nil: none) or failed (when set) returns an error.
func waitStartsIn(ctx context.Context, p *proc.Proc, records string, ss []sent, failed func() error) (map[string]time.Time, error) {
	var starts map[string]time.Time
	err := waitFor(ctx, p, 5*time.Minute, func() error {
		if failed != nil {
			if err := failed(); err != nil {
				return fatal{err}
			}
		}
		var err error
		if starts, err = readStarts(records); err != nil {
			return err
		}
		left := 0
		for _, s := range ss {
			if _, ok := starts[s.id]; !ok {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d of %d agents not started", left, len(ss))
		}
		return nil
	})
	return starts, err
}

// pickup sends new-task webhooks at b.o.rate for b.o.rateFor and returns,
// per job, accepted -> running (the status record's started_at) and
// accepted -> agent started, and how many jobs were accepted but not yet
// started when the last webhook was answered: a runner that keeps up
// has no more of those than it has slots. Each pull request's head
// branch is pushed to origin just before its webhook is sent, as when a
// person opens one, so the runner's clone must fetch to find it.
func (b *bench) pickup(ctx context.Context) (pickup, dispatch stats.Sample, behind int, err error) {
	head, err := b.mainHead(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	ds, ns, err := branchDeliveries("burst", b.rateN(), head)
	if err != nil {
		return nil, nil, 0, err
	}
	ss, err := b.sendPaced(ctx, b.gateway, ds, ns, b.o.rate, func(i int) error { return b.pushBranch("burst", i, head) })
	if err != nil {
		return nil, nil, 0, err
	}
	var last time.Time
	for _, s := range ss {
		if s.accepted.After(last) {
			last = s.accepted
		}
	}
	starts, err := b.waitStarts(ctx, ss)
	if err != nil {
		return nil, nil, 0, err
	}
	kv, err := b.js.KeyValue(ctx, proto.BucketJobs)
	if err != nil {
		return nil, nil, 0, err
	}
	for _, s := range ss {
		e, err := kv.Get(ctx, s.id)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("status of %s: %w", s.id, err)
		}
		st, err := proto.DecodeStatus(e.Value())
		if err != nil {
			return nil, nil, 0, err
		}
		pickup = append(pickup, st.StartedAt.Sub(s.accepted))
		dispatch = append(dispatch, starts[s.id].Sub(s.accepted))
		if starts[s.id].After(last) {
			behind++
		}
	}
	return pickup, dispatch, behind, nil
}

// dispatch sends ds one at a time at b.o.dispatchRate and returns, per
// job, webhook sent -> agent started.
func (b *bench) dispatch(ctx context.Context, ds []gitea.Delivery, ns []int) (stats.Sample, error) {
	ss, err := b.sendPaced(ctx, b.gateway, ds, ns, b.o.dispatchRate, nil)
	if err != nil {
		return nil, err
	}
	starts, err := b.waitStarts(ctx, ss)
	if err != nil {
		return nil, err
	}
	var lat stats.Sample
	for _, s := range ss {
		lat = append(lat, starts[s.id].Sub(s.sent))
	}
	return lat, nil
}

// newTaskDeliveries makes n deliveries of n new tasks, each a pull request
// from its own agent branch agent/<prefix>-<i> (task <prefix>-<i>), so
// that each job's runner makes a new worktree; again(prefix) makes more
// jobs for the same tasks.
func newTaskDeliveries(prefix string, n int) ([]gitea.Delivery, []int, error) {
	return branchDeliveries(prefix, n, "")
}

// branchDeliveries is newTaskDeliveries with head as every delivery's
// head commit (a made-up one when empty).
func branchDeliveries(prefix string, n int, head string) ([]gitea.Delivery, []int, error) {
	ds := make([]gitea.Delivery, n)
	ns := make([]int, n)
	for i := range n {
		ns[i] = int(seq.Add(1))
		var err error
		ds[i], err = gitea.New(gitea.PR{Number: 100_000 + ns[i], Branch: fmt.Sprintf("agent/%s-%d", prefix, i), Seq: ns[i], HeadSHA: head})
		if err != nil {
			return nil, nil, err
		}
	}
	return ds, ns, nil
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
