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
	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/proto"
)

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
