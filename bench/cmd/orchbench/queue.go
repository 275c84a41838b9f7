package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/proto"
)

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
			m, st, err := jobMsg(id, "t-"+strconv.Itoa(i%tasks))
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
