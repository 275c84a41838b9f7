package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
)

// Three synchronized events of one pull request while its first review
// runs: the running review goes on (supersede: queued, the default), the
// middle one ends cancelled as superseded by the third, which waits at the
// newest head.
func TestNewerReviewSupersedesQueued(t *testing.T) {
	e, g := newGateway(t, nil)
	_, _, kv := natstest.Connect(t, e.srv)
	st := status.New(kv)
	ctx := context.Background()
	waitState := func(id string, want proto.State) *proto.Status {
		t.Helper()
		var rec *proto.Status
		natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			code, a := g.job(t, id)
			if code != http.StatusOK {
				return fmt.Errorf("GET /jobs/%s: %d", id, code)
			}
			rec = &a.Status
			rec.Job = a.Job
			if rec.State != want {
				return fmt.Errorf("job %s is %s, want %s", id, rec.State, want)
			}
			return nil
		})
		return rec
	}
	first := g.pushReview(t, "1111111111111111111111111111111111111111")
	rec := waitState(first, proto.StateQueued)
	// A runner has it.
	if _, err := st.Apply(ctx, &rec.Job, status.StartAttempt(1, 3, "r1", "", time.Now())); err != nil {
		t.Fatal(err)
	}
	second := g.pushReview(t, "2222222222222222222222222222222222222222")
	waitState(second, proto.StateQueued)
	// The index must have seen the second before the third supersedes it.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := g.queue(t).Counts[string(proto.StateQueued)]; n != 1 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	third := g.pushReview(t, "3333333333333333333333333333333333333333")
	mid := waitState(second, proto.StateCancelled)
	if mid.Error != proto.ReasonSuperseded || mid.SupersededBy != third {
		t.Errorf("middle review: error %q superseded by %q, want superseded by %s", mid.Error, mid.SupersededBy, third)
	}
	if newest := waitState(third, proto.StateQueued); newest.Job.Task.HeadSHA != "3333333333333333333333333333333333333333" {
		t.Errorf("newest review is at head %q", newest.Job.Task.HeadSHA)
	}
	if rec, _, _ := st.Get(ctx, first); rec.State != proto.StateRunning {
		t.Errorf("the running review is %s, want it left running", rec.State)
	}
}

// With supersede: running, a newer review stops the running one too: its
// record turns cancelled (superseded), which its runner's cancel watch
// acts on.
func TestSupersedeRunning(t *testing.T) {
	e, g := newGateway(t, func(e *env) { e.writeRegistry(registryYAML + "    supersede: running\n") })
	_, _, kv := natstest.Connect(t, e.srv)
	st := status.New(kv)
	ctx := context.Background()
	first := g.pushReview(t, "1111111111111111111111111111111111111111")
	_, a := g.job(t, first)
	if _, err := st.Apply(ctx, &a.Job, status.StartAttempt(1, 3, "r1", "", time.Now())); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := g.queue(t).Counts[string(proto.StateRunning)]; n != 1 {
			return fmt.Errorf("%d running", n)
		}
		return nil
	})
	second := g.pushReview(t, "2222222222222222222222222222222222222222")
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, _, _ := st.Get(ctx, first)
		if rec.State != proto.StateCancelled || rec.SupersededBy != second {
			return fmt.Errorf("running review is %s (superseded by %q)", rec.State, rec.SupersededBy)
		}
		return nil
	})
}

// pushReview sends a synchronized event of the fixture's pull request at
// head and returns the id of the one review it queues.
func (g *gw) pushReview(t *testing.T, head string) string {
	t.Helper()
	raw, _ := readFixture(t, "gitea/pull_request__opened")
	a, out := g.postGitea(t, testkit.EditJSON(t, raw, func(m map[string]any) {
		m["action"] = "synchronized"
		m["pull_request"].(map[string]any)["head"].(map[string]any)["sha"] = head
	}))
	if len(a.Jobs) != 1 || a.Jobs[0].Kind != string(proto.KindReview) {
		t.Fatalf("synchronized answered %s, want one review", out)
	}
	return a.Jobs[0].ID
}

// A review this gateway published, superseded while it waits in JOBS
// without a record, gets its record from the job as the gateway published
// it: nothing is read back from JOBS (no direct get of it), and the
// record holds the job whole.
func TestSupersedeReadsNoJobBack(t *testing.T) {
	e, g := newGateway(t, func(e *env) {
		// No record is made for a waiting job meanwhile: the supersede
		// makes it.
		e.tune = func(c *gateway.Config) { c.RecordAfter = time.Hour }
	})
	nc, _, kv := natstest.Connect(t, e.srv)
	st := status.New(kv)
	ctx := context.Background()
	const head = "1111111111111111111111111111111111111111"
	first := g.pushReview(t, head)
	// The gateway read JOBS at its start; any direct get from here on is
	// a job read back.
	var gets atomic.Int32
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET."+proto.StreamJobs, func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	second := g.pushReview(t, "2222222222222222222222222222222222222222")
	var rec *proto.Status
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, _, err = st.Get(ctx, first)
		if err != nil {
			return err
		}
		if rec.State != proto.StateCancelled || rec.SupersededBy != second {
			return fmt.Errorf("first review is %s (superseded by %q)", rec.State, rec.SupersededBy)
		}
		return nil
	})
	if rec.Job.ID != first || rec.Job.Task.HeadSHA != head || rec.Job.Project != "widgets" {
		t.Errorf("the superseded review's record holds job %s of %s at %q, want %s of widgets at %s", rec.Job.ID, rec.Job.Project, rec.Job.Task.HeadSHA, first, head)
	}
	if n := gets.Load(); n != 0 {
		t.Errorf("%d direct gets of %s for a job this gateway published", n, proto.StreamJobs)
	}
}
