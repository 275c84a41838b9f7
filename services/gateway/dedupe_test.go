package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
)

// A signed delivery replayed is a duplicate however late it comes: while
// its job waits in JOBS with no record, past JetStream's duplicate window,
// and after a runner ran the job and its status record expired (its
// dedupe key, written once the record existed, outlives it). Nothing is
// queued again and no record is made. The record's TTL and the window are
// seconds here; the dedupe key's is an hour.
func TestReplayIsDuplicateHoweverLate(t *testing.T) {
	t.Parallel()
	const window = time.Second
	e, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) {
			c.StatusTTL, c.DuplicateWindow, c.DedupeTTL = 4*time.Second, window, time.Hour
		}
	})
	body := prBody(t, 7, "opened")
	first, _ := g.postGitea(t, body)
	if first.Spooled || first.Jobs[0].Duplicate {
		t.Fatalf("first delivery: %+v", first)
	}
	id := first.Jobs[0].ID
	// natstest.Connect would ensure the topology of the defaults, a
	// week's TTL among them.
	nc, err := nats.Connect(e.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, proto.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	dd, err := js.KeyValue(ctx, proto.BucketDedupe)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := dd.Status(ctx); err != nil || st.TTL() != time.Hour {
		t.Errorf("dedupe bucket TTL %v (%v), want ORCH_DEDUPE_TTL, 1h", st.TTL(), err)
	}
	replay := func(want uint64) {
		t.Helper()
		again, _ := g.postGitea(t, body) // the same signed delivery
		if again.Jobs[0].ID != id || !again.Jobs[0].Duplicate {
			t.Errorf("replay: %+v, want job %s marked duplicate", again, id)
		}
		if n, err := streamMsgs(js); err != nil || n != want {
			t.Errorf("JOBS holds %d messages (%v), want %d", n, err, want)
		}
	}
	// JetStream's window is a time on the server; nothing announces its
	// end.
	time.Sleep(2 * window)
	replay(1)

	// A runner takes the job, runs it and acks it (its message goes).
	code, a := g.job(t, id)
	if code != http.StatusOK {
		t.Fatalf("GET /jobs/%s: %d", id, code)
	}
	st := status.New(kv)
	if _, err := st.Apply(ctx, &a.Job, status.StartAttempt(1, 3, "r1", "", time.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Apply(ctx, &a.Job, status.Finish(status.Outcome{Attempt: 1, MaxAttempts: 3, Runner: "r1", FinishedAt: time.Now()})); err != nil {
		t.Fatal(err)
	}
	jobs, err := js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range natstest.Messages(t, js, proto.StreamJobs) {
		if err := jobs.DeleteMsg(ctx, m.Sequence); err != nil {
			t.Fatal(err)
		}
	}
	// The key follows the record; the record expires, and the gateway's
	// index forgets it.
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if _, err := dd.Get(ctx, id); err != nil {
			return fmt.Errorf("dedupe key: %w", err)
		}
		if _, err := kv.Get(ctx, id); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("status record still there (%v)", err)
		}
		for _, r := range g.queue(t).Recent {
			if r.ID == id {
				return errors.New("the index still lists the job")
			}
		}
		return nil
	})
	replay(0)
	if _, err := kv.Get(ctx, id); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the replay made a status record (%v)", err)
	}
}

// Jobs carried out of the spool are known from JOBS, and get their dedupe
// keys once runners record them, as any others: a key is written once the
// record's latest version is a quarter of the record's TTL old (4 s here),
// and never for a job without a record.
func TestSpooledJobsAreDedupeRecorded(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) { c.StatusTTL, c.RecordAfter = 4*time.Second, time.Hour }
	})
	e.srv.Shutdown()
	ids := spoolWebhooks(t, g, 4000, 4)
	restartAndWait(t, e, g, ids)
	_, js, kv := natstest.Connect(t, e.srv)
	ctx := context.Background()
	dd, err := js.KeyValue(ctx, proto.BucketDedupe)
	if err != nil {
		t.Fatal(err)
	}
	recorded, waiting := ids[:3], ids[3]
	for _, id := range recorded {
		code, a := g.job(t, id)
		if code != http.StatusOK || a.Status.State != proto.StateQueued {
			t.Fatalf("spooled job %s: %d %+v", id, code, a)
		}
		if _, err := status.New(kv).Apply(ctx, &a.Job, status.StartAttempt(1, 3, "r1", "", time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, id := range recorded {
			if _, err := dd.Get(ctx, id); err != nil {
				return fmt.Errorf("dedupe key of spooled job %s: %w", id, err)
			}
		}
		return nil
	})
	if _, err := dd.Get(ctx, waiting); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("dedupe key of job %s, which has no record: %v", waiting, err)
	}
}
