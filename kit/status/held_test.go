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

// Two releasers racing for one held job publish one message between them
// (the hold's message id), and the record says queued once; a job that is
// not held is not published.
func TestReleaseHeldOnce(t *testing.T) {
	js, kv := natstest.JetStream(t)
	s := status.New(kv)
	ctx := context.Background()
	job := &proto.Job{ID: "j1", Kind: proto.KindImplement, Project: "widgets", Task: proto.Task{ID: "t"}}
	if _, err := s.Apply(ctx, job, status.Queue(3)); err != nil {
		t.Fatal(err)
	}
	publish := status.PublishTo(js)
	if _, err := s.ReleaseHeld(ctx, job.ID, "", publish); !errors.Is(err, status.ErrNotHeld) {
		t.Fatalf("release of a queued job: %v, want ErrNotHeld", err)
	}
	if _, err := s.Apply(ctx, job, status.Hold(1, "r1", proto.HoldOverBudget, time.Time{}, time.Now())); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := s.ReleaseHeld(ctx, job.ID, "", publish); err != nil && !errors.Is(err, status.ErrNotHeld) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	st, _, err := s.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != proto.StateQueued || st.Holds != 1 {
		t.Fatalf("record after release: %+v", st)
	}
	if msgs := natstest.Messages(t, js, proto.StreamJobs); len(msgs) != 1 || msgs[0].Header.Get("Nats-Msg-Id") != proto.HeldMsgID(job.ID, 1) {
		t.Fatalf("messages on %s: %d, want 1 with the hold's id", proto.StreamJobs, len(msgs))
	}
}
