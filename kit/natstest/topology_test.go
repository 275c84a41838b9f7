package natstest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

func TestEnsureIsIdempotent(t *testing.T) {
	js, _ := natstest.JetStream(t)
	ctx := context.Background()
	for range 2 {
		if _, err := (proto.Topology{}).Ensure(ctx, js); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{proto.StreamJobs, proto.StreamAdvisories, proto.StreamDLQ, "KV_" + proto.BucketJobs, proto.StreamTaskLocks} {
		if _, err := js.Stream(ctx, name); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
	}
	s, err := js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Retention != jetstream.WorkQueuePolicy || info.Config.Duplicates != proto.DuplicateWindowDefault {
		t.Errorf("JOBS config = %+v", info.Config)
	}
}

// A JOBS stream made before direct gets were allowed (by an older orch)
// gets them from Ensure, with its queued jobs kept, so `nats stream view
// JOBS` works after an upgrade.
func TestEnsureAllowsDirectOnAnExistingJobsStream(t *testing.T) {
	js, _ := natstest.JetStream(t)
	ctx := context.Background()
	old := proto.Topology{}.JobsStream()
	old.AllowDirect = false
	if _, err := js.CreateOrUpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, proto.JobSubject("widgets", proto.KindReview), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := (proto.Topology{}).Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || !info.Config.AllowDirect || info.Config.Retention != jetstream.WorkQueuePolicy || info.State.Msgs != 1 {
		t.Fatalf("JOBS after Ensure: %+v %+v (%v), want direct gets allowed and the job kept", info.Config, info.State, err)
	}
	if _, err := s.GetMsg(ctx, info.State.FirstSeq); err != nil {
		t.Errorf("reading job 1: %v", err)
	}
}

// The advisories JetStream publishes for JOBS land in JOBS_ADVISORIES, so
// none is lost while no notifier listens.
func TestAdvisoriesAreCaptured(t *testing.T) {
	js, _ := natstest.JetStream(t)
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(1, 1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i, kind := range []proto.Kind{proto.KindReview, proto.KindFix} {
		job := proto.Job{Schema: 1, ID: proto.JobID(string(kind)), Kind: kind, Project: "p", Task: proto.Task{ID: "t"}}
		data, err := json.Marshal(job)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, proto.JobSubject("p", kind), data); err != nil {
			t.Fatal(err)
		}
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := msg.TermWithReason(proto.TermReason(job.ID, "cannot run")); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := msg.Nak(); err != nil { // MaxDeliver 1: the next pull sees it exhausted
				t.Fatal(err)
			}
			// The batch is read to its end, so its fetch is over too.
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			for range batch.Messages() {
			}
		}
	}
	adv, err := js.Stream(ctx, proto.StreamAdvisories)
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		info, err := adv.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 2 {
			return errors.New("advisories not captured yet")
		}
		return nil
	})
	for seq, want := range map[uint64]string{1: proto.AdvisoryTerminated, 2: proto.AdvisoryMaxDeliveries} {
		raw, err := adv.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		a, err := proto.DecodeAdvisory(raw.Data)
		if err != nil || a.Type != want {
			t.Errorf("advisory %d = %+v, %v; want type %s", seq, a, err, want)
		}
		if a.Type == proto.AdvisoryTerminated {
			if id, cause := proto.ParseTermReason(a.Reason); id != proto.JobID("review") || cause != "cannot run" {
				t.Errorf("term reason %q parsed as %q, %q", a.Reason, id, cause)
			}
		}
	}
}
