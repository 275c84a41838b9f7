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
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
)

// A signed delivery replayed after its status record expired (and after
// JetStream's duplicate window) is a duplicate: nothing is queued and no
// record is made. The record's TTL and the window are seconds here; the
// dedupe key's is an hour.
func TestReplayAfterStatusRecordExpiredIsDuplicate(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) {
			c.StatusTTL, c.DuplicateWindow, c.DedupeTTL = 2*time.Second, time.Second, time.Hour
		}
	})
	body := prBody(t, 7, "opened")
	first, _ := g.postGitea(t, body)
	if first.Spooled || first.Jobs[0].Duplicate {
		t.Fatalf("first delivery: %+v", first)
	}
	id := first.Jobs[0].ID
	// A read through the API waits for the record and the key, which
	// follow the 202.
	if code, out := g.read(t, "/jobs/"+id); code != http.StatusOK {
		t.Fatalf("GET /jobs/%s right after its 202: %d %s", id, code, out)
	}
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
	// The record expires, and the gateway's index forgets it.
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
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
	again, _ := g.postGitea(t, body) // the same signed delivery
	if again.Jobs[0].ID != id || !again.Jobs[0].Duplicate {
		t.Errorf("replay: %+v, want job %s marked duplicate", again, id)
	}
	if n, err := streamMsgs(js); err != nil || n != 1 {
		t.Errorf("JOBS holds %d messages (%v), want the first one alone", n, err)
	}
	if _, err := kv.Get(ctx, id); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the replay made a status record (%v)", err)
	}
}

// Jobs carried out of the spool get their dedupe keys as any others.
func TestSpooledJobsAreDedupeRecorded(t *testing.T) {
	t.Parallel()
	e, g, ids := spoolWhileDown(t, 4000, 3)
	restartAndWait(t, e, g, ids)
	_, js, _ := natstest.Connect(t, e.srv)
	ctx := context.Background()
	dd, err := js.KeyValue(ctx, proto.BucketDedupe)
	if err != nil {
		t.Fatal(err)
	}
	// The keys follow the publishes.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, id := range ids {
			if _, err := dd.Get(ctx, id); err != nil {
				return fmt.Errorf("dedupe key of spooled job %s: %w", id, err)
			}
		}
		return nil
	})
}
