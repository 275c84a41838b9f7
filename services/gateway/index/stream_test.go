package index

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// publishJob puts a job of task t in JOBS, as the gateway does, and
// returns its sequence.
func publishJob(t *testing.T, js jetstream.JetStream, id, task string) uint64 {
	t.Helper()
	data, err := json.Marshal(proto.Job{Schema: proto.SchemaVersion, ID: id, Kind: proto.KindReview, Project: "p",
		Task: proto.Task{ID: task, Title: "title of " + id}, CreatedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(context.Background(), proto.JobSubject("p", proto.KindReview), data, jetstream.WithMsgID(id))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// The jobs JOBS holds without a record are in the index: those queued
// before it started (more than one batch of them) and those queued after,
// until their record replaces them or they leave JOBS without one.
func TestFollowJobs(t *testing.T) {
	srv := natstest.Server(t)
	nc, js, kv := natstest.Connect(t, srv)
	ctx := context.Background()
	const before = jobsBatch + 44
	seqs := map[string]uint64{}
	for i := range before {
		id := "before-" + strconv.Itoa(i)
		seqs[id] = publishJob(t, js, id, "t-"+strconv.Itoa(i%7))
	}
	ix := New()
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { ix.Watch(fctx, kv, nil, zap.NewNop()) })
	wg.Go(func() { ix.FollowJobs(fctx, nc, nil, zap.NewNop()) })
	defer func() { cancel(); wg.Wait() }()
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !ix.Synced() {
			return fmt.Errorf("not synced")
		}
		return nil
	})
	if n := ix.Counts()[proto.StateQueued]; n != before {
		t.Errorf("%d queued, want the %d jobs in JOBS", n, before)
	}
	for id, seq := range seqs {
		if got, ok := ix.Waiting(id); !ok || got != seq {
			t.Fatalf("Waiting(%s) = %d %v, want %d", id, got, ok, seq)
		}
	}
	if open := ix.OpenJobs("p", "t-3"); len(open) != (before+3)/7 {
		t.Errorf("task t-3 has %d open jobs, want %d", len(open), (before+3)/7)
	}

	// Queued by another gateway after the start: found by following.
	later := publishJob(t, js, "later", "t-later")
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if seq, ok := ix.Waiting("later"); !ok || seq != later {
			return fmt.Errorf("job queued after the start not known (%d %v)", seq, ok)
		}
		return nil
	})
	job, ok, err := JobAt(ctx, nc, later)
	if err != nil || !ok || job.ID != "later" || job.Task.Title != "title of later" {
		t.Errorf("JobAt(%d) = %+v %v %v", later, job, ok, err)
	}

	// A runner's record replaces the entry; an entry stays past any TTL.
	putQueued(t, kv, "before-0")
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, ok := ix.Waiting("before-0"); ok {
			return fmt.Errorf("record not read")
		}
		return nil
	})
	ix.expire(time.Now())
	if !ix.Has("before-1") || ix.Has("before-0") {
		t.Errorf("expire: before-1 known %v (from JOBS: no TTL), before-0 known %v (its record expired)", ix.Has("before-1"), ix.Has("before-0"))
	}
	// A job that left JOBS without a record is forgotten.
	s, err := js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, seqs["before-2"]); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := JobAt(ctx, nc, seqs["before-2"]); ok || err != nil {
		t.Errorf("JobAt of a deleted message: %v %v", ok, err)
	}
	if err := ix.prune(ctx, nc); err != nil {
		t.Fatal(err)
	}
	if ix.Has("before-2") || !ix.Has("before-3") {
		t.Errorf("after prune: deleted job known %v, waiting job known %v", ix.Has("before-2"), ix.Has("before-3"))
	}
}
