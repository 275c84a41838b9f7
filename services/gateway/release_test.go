package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// GET /queue counts held jobs; POST /jobs/{id}/release (token) publishes
// a held job again under its hold's message id and records it queued and
// released by hand; a job that is not held is 409, an unknown one 404.
func TestReleaseHeldJob(t *testing.T) {
	e, g := newGateway(t, nil)
	_, js, kv := natstest.Connect(t, e.srv)
	st := status.New(kv)
	ctx := context.Background()
	job := &proto.Job{Schema: proto.SchemaVersion, ID: "held-1", Kind: proto.KindReview, Project: "widgets",
		Task: proto.Task{ID: "pr-1"}, CreatedAt: time.Now().UTC()}
	if _, err := st.Apply(ctx, job, status.Queue(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Apply(ctx, job, status.Hold(1, "r1", proto.HoldOverBudget, time.Now().Add(time.Hour), time.Now())); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := g.queue(t).Counts[string(proto.StateHeld)]; n != 1 {
			return fmt.Errorf("/queue counts %d held, want 1", n)
		}
		return nil
	})

	if code, _ := g.do(t, http.MethodPost, "/jobs/held-1/release", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("release without the token: %d, want 401", code)
	}
	auth := map[string]string{"Authorization": "Bearer " + apiToken}
	code, body := g.do(t, http.MethodPost, "/jobs/held-1/release", auth, nil)
	var change struct {
		State proto.State `json:"state"`
	}
	if err := json.Unmarshal(body, &change); err != nil || code != http.StatusAccepted || change.State != proto.StateQueued {
		t.Fatalf("release: %d %s", code, body)
	}
	rec, _, err := st.Get(ctx, job.ID)
	if err != nil || rec.State != proto.StateQueued || rec.ReleasedBy != "api" {
		t.Fatalf("record after release: %+v %v", rec, err)
	}
	msgs := natstest.Messages(t, js, proto.StreamJobs)
	if len(msgs) != 1 || msgs[0].Header.Get("Nats-Msg-Id") != proto.HeldMsgID(job.ID, 1) {
		t.Fatalf("JOBS holds %d messages, want the released job once under its hold's id", len(msgs))
	}
	if code, body := g.do(t, http.MethodPost, "/jobs/held-1/release", auth, nil); code != http.StatusConflict {
		t.Errorf("second release: %d %s, want 409", code, body)
	}
	if code, _ := g.do(t, http.MethodPost, "/jobs/nope/release", auth, nil); code != http.StatusNotFound {
		t.Errorf("release of an unknown job: %d, want 404", code)
	}
}
