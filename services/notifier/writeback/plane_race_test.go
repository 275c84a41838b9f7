package writeback

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// Plane's comment view checks for an external id and then inserts, with
// no constraint between (apps/api/plane/api/views/issue.py): two creates
// at once both succeed, as the fake shows first. Two notifiers on one
// job still make one comment, because only the holder of the job's
// write-back lease writes: the other never sends a create.
func TestPlaneTwoNotifiersOneComment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const raced = "00000000-0000-4000-8000-0000000race1"
	item := "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a2"
	b.plane.AddItem(planeWS, planeProj, raced)
	b.plane.AddItem(planeWS, planeProj, item)
	// A slow commit: each create waits a moment between its check and
	// its insert, as a busy Plane does.
	b.plane.BetweenCheckAndInsert = func(string) { time.Sleep(300 * time.Millisecond) }

	// Without a lease: two creates of one external id at once.
	p := NewPlane(b.plane.URL, planeKey, &http.Client{Timeout: 10 * time.Second})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, _, err := p.CreateComment(b.ctx, planeWS, planeProj, raced, "job-raced", "<p>x</p>"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(b.plane.Comments(raced)); n != 2 {
		t.Fatalf("two creates at once made %d comments; the fake must let both pass its check, as Plane does", n)
	}

	// Two notifiers on one job.
	b.start("n1")
	b.start("n2")
	job := &proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID(t.Name()), Kind: proto.KindImplement, Project: "widgets",
		Task: proto.Task{ID: "wid-41", Title: "Spin", PlaneItem: item}, Source: proto.Source{System: "plane"}, CreatedAt: time.Now().UTC(),
	}
	b.set(job, running(1))
	b.set(job, done("Implemented."))
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		cs := b.plane.Comments(item)
		if len(cs) != 1 {
			return fmt.Errorf("%d comments, want 1", len(cs))
		}
		if c := cs[0]; c.ExternalID != job.ID || len(c.Bodies) == 0 {
			return fmt.Errorf("comment %+v, want the job's", c)
		}
		return nil
	})
	w := b.writer("probe")
	b.settle(w, job)
	creates := 0
	for _, r := range b.plane.Requests() {
		if r.Method == http.MethodPost && r.Path == commentsPathFor(item) {
			creates++
		}
	}
	if creates != 1 || len(b.plane.Comments(item)) != 1 {
		t.Errorf("%d creates and %d comments on the item, want one of each", creates, len(b.plane.Comments(item)))
	}
}

func commentsPathFor(item string) string { return "/api/v1" + commentsPath(planeWS, planeProj, item) }
