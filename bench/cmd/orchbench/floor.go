package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/proto"
)

// jetStreamFloor times, n times one after the other, the JetStream writes
// a job cannot start without, done by hand on the same server in
// sequence, each fsynced (SyncAlways): the job's publish (the gateway's
// intake, which answers once it is acked; the status record follows the
// answer), the task lock's creation and the status record's write of
// running (the runner's). It is the floor under "worktree exists" that
// no runner code can remove while those writes are confirmed before the
// agent starts.
func (b *bench) jetStreamFloor(ctx context.Context, n int) (stats.Sample, error) {
	s, err := b.rawStream(ctx, "BENCH_FLOOR", "bench.floor.>")
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.js.DeleteStream(context.WithoutCancel(ctx), s.CachedInfo().Config.Name) }()
	topo := proto.Topology{}
	jobsCfg, locksCfg := topo.JobsBucket(), topo.TaskLocksBucket()
	jobsCfg.Bucket, locksCfg.Bucket = "bench_floor_jobs", "bench_floor_locks"
	var kvs [2]jetstream.KeyValue
	for i, cfg := range []jetstream.KeyValueConfig{jobsCfg, locksCfg} {
		_ = b.js.DeleteKeyValue(ctx, cfg.Bucket)
		if kvs[i], err = b.js.CreateKeyValue(ctx, cfg); err != nil {
			return nil, err
		}
		defer func() { _ = b.js.DeleteKeyValue(context.WithoutCancel(ctx), cfg.Bucket) }()
	}
	jobs, locks := kvs[0], kvs[1]
	record := []byte(`{"state":"queued"}`)
	var lat stats.Sample
	for i := range n {
		id := fmt.Sprintf("floor-%d", i)
		start := time.Now()
		if _, err := b.js.Publish(ctx, "bench.floor.job", record, jetstream.WithMsgID(id)); err != nil {
			return nil, err
		}
		if _, err := locks.Create(ctx, id, record); err != nil {
			return nil, err
		}
		if _, err := jobs.Create(ctx, id, record); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(start))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return lat, nil
}
