package status_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// The guards hold against the bucket: a second queue leaves the record,
// a cancel wins over a settle that read the record before it, and many
// writers at once each land exactly once.
func TestApply(t *testing.T) {
	_, kv := natstest.JetStream(t)
	s := status.New(kv)
	ctx := context.Background()
	job := &proto.Job{ID: "j1", Kind: proto.KindImplement, Project: "widgets", Task: proto.Task{ID: "t"}}

	if _, err := s.Apply(ctx, job, status.Queue(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, job, status.StartAttempt(1, 3, "r1", "/log", time.Now())); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Apply(ctx, job, status.Queue(3)); !errors.Is(err, status.ErrExists) || st.State != proto.StateRunning {
		t.Fatalf("second queue: %v, record %+v", err, st)
	}
	if _, err := s.Cancel(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	st, err := s.Apply(ctx, job, status.Finish(status.Outcome{Attempt: 1}))
	if !errors.Is(err, status.ErrTerminal) || st.State != proto.StateCancelled {
		t.Fatalf("finish after cancel: %v, record %+v", err, st)
	}
	if _, err := s.Cancel(ctx, "nobody"); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("cancel of an unknown job: %v", err)
	}

	// Ten notifiers race to mark one failure alerted: one wins.
	failed := &proto.Job{ID: "j2"}
	if _, err := s.Apply(ctx, failed, status.DeadLetter(3, 1, time.Now())); err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
	)
	for range 10 {
		wg.Go(func() {
			_, err := s.Apply(ctx, failed, status.MarkAlerted())
			if err != nil && !errors.Is(err, status.ErrAlerted) {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				wins++
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d writers marked the alert, want 1", wins)
	}
}

// ApplyFrom with the record as it is writes it; with a record that has
// changed since, it reads it again and the guard judges the newer one.
func TestApplyFrom(t *testing.T) {
	_, _, kv := natstest.Connect(t, natstest.Server(t))
	s := status.New(kv)
	ctx := context.Background()
	job := &proto.Job{ID: "j1", Kind: proto.KindImplement, Project: "widgets", Task: proto.Task{ID: "t"}}
	if _, err := s.Apply(ctx, job, status.Queue(3)); err != nil {
		t.Fatal(err)
	}
	cur, rev, err := s.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.ApplyFrom(ctx, job, cur, rev, status.StartAttempt(1, 3, "r1", "/log", time.Now()))
	if err != nil || st.State != proto.StateRunning {
		t.Fatalf("from the current record: %v, %+v", err, st)
	}
	if got, _, _ := s.Get(ctx, job.ID); got.State != proto.StateRunning || got.Runner != "r1" {
		t.Fatalf("bucket holds %+v, want running on r1", got)
	}

	// A second job read while queued, then cancelled: its start from the
	// old record is refused by the cancel.
	other := &proto.Job{ID: "j2", Kind: proto.KindImplement, Project: "widgets", Task: proto.Task{ID: "t"}}
	if _, err := s.Apply(ctx, other, status.Queue(3)); err != nil {
		t.Fatal(err)
	}
	old, oldRev, err := s.Get(ctx, other.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	st, err = s.ApplyFrom(ctx, other, old, oldRev, status.StartAttempt(1, 3, "r1", "/log", time.Now()))
	if !errors.Is(err, status.ErrTerminal) || st.State != proto.StateCancelled {
		t.Fatalf("from an old record: %v, %+v; want refused as cancelled", err, st)
	}
}
