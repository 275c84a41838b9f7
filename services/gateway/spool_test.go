package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// spoolWhileDown runs a ready gateway, shuts its JetStream server down
// and sends n distinct pull requests, numbered from first: each must be
// answered 202 and spooled. It returns the jobs named.
func spoolWhileDown(t *testing.T, first, n int) (*env, *gw, []string) {
	t.Helper()
	e, g := newGateway(t, nil)
	e.srv.Shutdown()
	return e, g, spoolWebhooks(t, g, first, n)
}

// spoolWebhooks sends n distinct pull requests, numbered from first, while
// JetStream is down: each must be answered 202 and spooled.
func spoolWebhooks(t *testing.T, g *gw, first, n int) []string {
	t.Helper()
	var ids []string
	for i := first; i < first+n; i++ {
		a := g.postPR(t, i, "opened")
		if !a.Spooled || len(a.Jobs) != 1 {
			t.Fatalf("webhook %d: %+v, want one spooled job", i, a)
		}
		ids = append(ids, a.Jobs[0].ID)
	}
	return ids
}

// restartAndWait starts JetStream again and waits until JOBS holds exactly
// the jobs named, once each, and the spool is empty.
func restartAndWait(t *testing.T, e *env, g *gw, want []string) {
	t.Helper()
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	_, js, _ := natstest.Connect(t, e.srv)
	natstest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		n, err := streamMsgs(js)
		if err != nil {
			return err
		}
		if d := g.queue(t).Spool.Depth; n != uint64(len(want)) || d != 0 {
			return fmt.Errorf("JOBS holds %d, spool %d; want %d and 0", n, d, len(want))
		}
		return nil
	})
	got := jobsInStream(t, js)
	for _, id := range want {
		if !got[id] {
			t.Errorf("job %s missing from JOBS", id)
		}
	}
	if len(got) != len(want) {
		t.Errorf("JOBS holds %d jobs, want %d", len(got), len(want))
	}
}

func TestSpoolWhileJetStreamIsDown(t *testing.T) {
	t.Parallel()
	e, g, ids := spoolWhileDown(t, 1000, 50)
	if d := g.queue(t).Spool.Depth; d != 50 {
		t.Errorf("spool depth %d, want 50", d)
	}
	if m := g.metrics(t); !strings.Contains(m, "orch_gateway_spool_depth 50") {
		t.Errorf("metrics lack the spool depth 50:\n%s", grep(m, "spool"))
	}
	restartAndWait(t, e, g, ids)
}

func TestSpoolSurvivesGatewayRestart(t *testing.T) {
	t.Parallel()
	e, g, ids := spoolWhileDown(t, 2000, 25)
	g.stop(t)
	// The new gateway starts while JetStream is still down, reads the
	// spool, and takes more webhooks behind the spooled ones.
	g = e.start()
	if d := g.queue(t).Spool.Depth; d != 25 {
		t.Errorf("spool depth after restart %d, want 25", d)
	}
	ids = append(ids, spoolWebhooks(t, g, 3000, 25)...)
	// A repeated event while spooled names the same job and adds nothing
	// to JOBS.
	if again := g.postPR(t, 2000, "opened"); again.Jobs[0].ID != ids[0] {
		t.Errorf("repeated event named %s, want %s", again.Jobs[0].ID, ids[0])
	}
	restartAndWait(t, e, g, ids)
}

func TestDedupeAcrossJetStreamRestart(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	first := g.postPR(t, 7, "opened")
	if first.Spooled {
		t.Fatal("spooled while JetStream was up")
	}
	// A runner takes and acks the job: WorkQueue retention removes it,
	// so after a restart JetStream's duplicate window no longer knows it.
	_, js, _ := natstest.Connect(t, e.srv)
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(1, 3, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	g.ready(t)
	again := g.postPR(t, 7, "opened")
	if again.Jobs[0].ID != first.Jobs[0].ID {
		t.Errorf("repeated event named %s, want %s", again.Jobs[0].ID, first.Jobs[0].ID)
	}
	_, js2, _ := natstest.Connect(t, e.srv)
	if n, err := streamMsgs(js2); err != nil || n != 0 {
		t.Errorf("JOBS holds %d messages (%v) after the repeat, want 0: the job was queued twice", n, err)
	}
}
