package writeback

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/trackertest"
	"github.com/orch-dev/orch/proto"
)

// A job that fails once and then succeeds leaves one comment, edited in
// place, whose last edit shows done with the agent's result; the commit
// status goes pending, then success. Gitea's 503 and 429 (Retry-After)
// on the way are waited out.
func TestFailOnceThenSucceed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var limitedAt time.Time
	b.gitea.SetFault(func(r *http.Request, route string, n int) *trackertest.Fault {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(route, "/comments") && n == 1:
			return &trackertest.Fault{Code: http.StatusServiceUnavailable}
		case r.Method == http.MethodPatch && n == 1:
			limitedAt = time.Now()
			return &trackertest.Fault{Code: http.StatusTooManyRequests, RetryAfter: time.Second}
		}
		return nil
	})
	b.start("n1")
	job := b.prJob("one", 7)
	b.set(job, func(*proto.Status) {})
	b.waitStatus(7, "pending")
	b.set(job, running(1))
	b.waitComment(7, proto.CommentMarker(job.ID), "orch · review · running", "attempt 1 of 3")
	b.set(job, retrying(1, "agent exited with code 1"))
	b.set(job, running(2))
	b.set(job, func(s *proto.Status) {
		done("The widget spins now.\n\nI added a test for it.")(s)
		s.SpentUSD = 0.67 // the failed attempt cost 0.25
	})
	c := b.waitComment(7, "✅ orch · review · done", "The widget spins now.", "7 turns", "$0.42", "$0.67 with the earlier attempts", "took 4m12s",
		"["+job.ID+"](https://orch.example.com/ui/jobs/"+job.ID+")")
	if !strings.HasPrefix(c.Body, proto.CommentMarker(job.ID)) {
		t.Errorf("comment does not open with the marker:\n%s", c.Body)
	}
	if len(c.Bodies) < 2 {
		t.Errorf("comment was never edited: %d bodies", len(c.Bodies))
	}
	st := b.waitStatus(7, "success")
	if st[0].State != "pending" || st[0].Context != "orch/review" || st[0].TargetURL != "https://orch.example.com/ui/jobs/"+job.ID {
		t.Errorf("first status %+v, want pending, orch/review, the job's page", st[0])
	}
	for _, r := range b.gitea.Requests() {
		if r.Method == http.MethodPatch && r.At.After(limitedAt) && r.At.Before(limitedAt.Add(time.Second)) {
			t.Errorf("an edit came %v after a 429 asking for 1s", r.At.Sub(limitedAt))
		}
	}
}

// A job that fails for good shows the reason, the end of its log and how
// to retry; no token, credential or runner path reaches the comment. The
// commit status ends in failure.
func TestTerminalFailureShowsReasonAndLogTail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start("n1")
	job := b.prJob("fails", 8)
	ws := t.TempDir()
	logPath := filepath.Join(ws, "logs", job.ID, "3.log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	var lg strings.Builder
	for i := range 40 {
		fmt.Fprintf(&lg, "agent line %d\n", i)
	}
	fmt.Fprintf(&lg, "export ORCH_API_TOKEN=t0psecretvalue\ncurl -H 'Authorization: token %s'\n", giteaToken)
	fmt.Fprintf(&lg, "FAIL %s/worktrees/widgets/pr-8/size_test.go:31: want 3, got 2\n", ws)
	if err := os.WriteFile(logPath, []byte(lg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	b.set(job, running(3))
	b.set(job, func(s *proto.Status) {
		s.State, s.Log, s.FinishedAt = proto.StateFailed, logPath, time.Now().UTC()
		s.Error = "agent exited with code 3: tests failed in " + ws + "/worktrees/widgets/pr-8"
	})
	c := b.waitComment(8, "❌ orch · review · failed", "**Reason:** agent exited with code 3: tests failed in",
		"agent line 39", "size_test.go:31: want 3, got 2", "/jobs/"+job.ID+"/retry")
	for _, leak := range []string{ws, giteaToken, "t0psecretvalue", "agent line 10\n"} {
		if strings.Contains(c.Body, leak) {
			t.Errorf("comment shows %q:\n%s", leak, c.Body)
		}
	}
	if st := b.waitStatus(8, "failure"); !strings.Contains(st[len(st)-1].Description, "agent exited with code 3") {
		t.Errorf("failure status says %q", st[len(st)-1].Description)
	}
}

// A notifier stopped while the job runs, and started again (as another
// process) after the job ended, shows the final state in the same comment.
// A create whose answer was lost is found again by its marker.
func TestRestartCatchesUpWithOneComment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.gitea.SetFault(func(r *http.Request, route string, n int) *trackertest.Fault {
		if r.Method == http.MethodPost && strings.HasSuffix(route, "/comments") && n == 1 {
			return &trackertest.Fault{Code: http.StatusBadGateway, After: true} // created, answer lost
		}
		return nil
	})
	stop := b.start("n1")
	job := b.prJob("restart", 9)
	b.set(job, running(1))
	b.waitComment(9, "orch · review · running")
	stop()
	b.set(job, done("Reviewed: two nits."))
	b.start("n2")
	c := b.waitComment(9, "✅ orch · review · done", "Reviewed: two nits.")
	if len(c.Bodies) != 2 {
		t.Errorf("comment has %d bodies, want the running one and the done one", len(c.Bodies))
	}
	b.waitStatus(9, "success")
}

// Two notifiers watching the same jobs write one comment per job.
func TestTwoNotifiersOneComment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start("n1")
	b.start("n2")
	var jobs []*proto.Job
	for i := range 4 {
		job := b.prJob(fmt.Sprint("j", i), 20+i)
		jobs = append(jobs, job)
		b.set(job, running(1))
	}
	for i, job := range jobs {
		b.set(job, retrying(1, "flaky"))
		b.set(job, running(2))
		b.set(job, done(fmt.Sprint("result ", i)))
	}
	for i := range jobs {
		b.waitComment(20+i, "✅ orch · review · done", fmt.Sprint("result ", i))
		b.waitStatus(20+i, "success")
	}
}

// A deleted pull request (404) ends that job's write-back with one log
// line, and another job's comment is still written.
func TestGoneStopsOnlyThatJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.writer("n1")
	b.start("n1")
	gone, ok := b.prJob("gone", 30), b.prJob("ok", 31)
	b.gitea.DeletePR(repo, 30)
	for _, job := range []*proto.Job{gone, ok} {
		b.set(job, running(1))
	}
	b.waitComment(31, "running")
	b.set(gone, done("never shown"))
	b.set(ok, done("shown"))
	b.waitComment(31, "✅ orch · review · done", "shown")
	b.settle(w, gone)
	if n := len(b.gitea.Comments(repo, 30)); n != 0 {
		t.Errorf("deleted PR has %d comments", n)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := b.logs.FilterMessageSnippet("write-back stopped").Len(); n != 1 {
			return fmt.Errorf("%d log lines say the write-back stopped, want 1", n)
		}
		return nil
	})
	if e := b.logs.FilterMessageSnippet("write-back stopped").All()[0]; e.ContextMap()["job"] != gone.ID {
		t.Errorf("stop logged for %v, want job %s", e.ContextMap()["job"], gone.ID)
	}
}

// A Plane work item gets one comment with external_source orch and the
// job id as external_id, even when a create's answer is lost (Plane's 409
// names the first), edited to the final state.
func TestPlaneComment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.plane.SetFault(func(r *http.Request, route string, n int) *trackertest.Fault {
		if r.Method == http.MethodPost && n == 1 {
			return &trackertest.Fault{Code: http.StatusBadGateway, After: true}
		}
		return nil
	})
	b.start("n1")
	item := "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"
	b.plane.AddItem(planeWS, planeProj, item)
	job := &proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID(t.Name()), Kind: proto.KindImplement, Project: "widgets",
		Task: proto.Task{ID: "wid-12", Title: "Spin", PlaneItem: item}, Source: proto.Source{System: "plane"}, CreatedAt: time.Now().UTC(),
	}
	b.set(job, running(1))
	b.set(job, done("Implemented <spin> & tested."))
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		cs := b.plane.Comments(item)
		if len(cs) != 1 {
			return fmt.Errorf("%d comments, want 1", len(cs))
		}
		c := cs[0]
		if c.ExternalSource != "orch" || c.ExternalID != job.ID {
			return fmt.Errorf("comment external %s/%s, want orch/%s", c.ExternalSource, c.ExternalID, job.ID)
		}
		if !strings.Contains(c.HTML, "orch · implement · done") || !strings.Contains(c.HTML, "Implemented &lt;spin&gt; &amp; tested.") {
			return fmt.Errorf("comment shows %s", c.HTML)
		}
		return nil
	})
}

// A job waiting in the queue longer than QueuedAfter gets its comment
// while still queued; a job cancelled before it started and before then
// gets none; with QueuedAfter zero, a job gets its comment at once.
func TestQueuedLongGetsComment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One writer at a time, so that the one with the QueuedAfter under
	// test is the one that writes.
	b.cfg.QueuedAfter = 300 * time.Millisecond
	stop := b.start("n1")
	long := b.prJob("long", 40)
	b.set(long, func(*proto.Status) {})
	b.waitComment(40, "⏳ orch · review · queued", "Waiting for a runner since")
	b.set(long, func(s *proto.Status) { s.State = proto.StateCancelled })
	b.waitComment(40, "🚫 orch · review · cancelled")
	stop()

	b.cfg.QueuedAfter = time.Hour
	stop = b.start("n2")
	short := b.prJob("short", 41)
	b.set(short, func(*proto.Status) {})
	b.waitStatus(41, "pending")
	b.set(short, func(s *proto.Status) { s.State = proto.StateCancelled })
	b.waitStatus(41, "error")
	if n := len(b.gitea.Comments(repo, 41)); n != 0 {
		t.Errorf("a job cancelled while briefly queued got %d comments", n)
	}
	stop()

	b.cfg.QueuedAfter = 0
	b.start("n3")
	b.set(b.prJob("now", 42), func(*proto.Status) {})
	b.waitComment(42, "⏳ orch · review · queued", "Waiting for a runner since")
}

// countingRecorder is a Recorder that keeps its counts.
type countingRecorder struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *countingRecorder) Wrote(tracker, op, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[tracker+"/"+op+"/"+outcome]++
}

func (r *countingRecorder) get(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

// Every write is counted by tracker, operation and how the tracker
// answered: a 503 as retry, a 422 as rejected, a deleted pull request as
// gone, the rest as ok; and the jobs left to write are counted until
// they are written.
func TestWritesCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &countingRecorder{}
	b.cfg.Recorder = rec
	b.gitea.SetFault(func(r *http.Request, route string, n int) *trackertest.Fault {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(route, "/comments") && n == 1:
			return &trackertest.Fault{Code: http.StatusServiceUnavailable}
		case r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/statuses/"+fmt.Sprintf("%040x", 41)):
			return &trackertest.Fault{Code: http.StatusUnprocessableEntity}
		}
		return nil
	})
	w := b.writer("n1")
	ctx, cancel := context.WithCancel(b.ctx)
	stopped := make(chan struct{})
	go func() { defer close(stopped); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })

	ok, rejected, gone := b.prJob("ok", 40), b.prJob("rejected", 41), b.prJob("gone", 42)
	b.gitea.DeletePR(repo, 42)
	for _, job := range []*proto.Job{ok, rejected, gone} {
		b.set(job, running(1))
	}
	b.waitComment(40, "running")
	b.set(ok, done("shown"))
	b.waitComment(40, "✅ orch · review · done")
	b.settle(w, ok)
	b.settle(w, gone)
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		for key, least := range map[string]int{
			"gitea/comment/retry":   1, // the 503
			"gitea/comment/ok":      2, // create, then the edit to done
			"gitea/status/ok":       2, // pending, success
			"gitea/status/rejected": 1, // the 422 on PR 41
			"gitea/status/gone":     1, // PR 42's head, asked of a deleted PR
		} {
			if got := rec.get(key); got < least {
				return fmt.Errorf("%s counted %d times, want at least %d", key, got, least)
			}
		}
		// PR 41 waits out its rejection; the others are written.
		if n := w.Pending(); n != 1 {
			return fmt.Errorf("%d jobs wait for a write, want 1 (the rejected one)", n)
		}
		return nil
	})
	for _, key := range []string{"plane/comment/ok", "gitea/comment/gone", "gitea/status/retry"} {
		if got := rec.get(key); got != 0 {
			t.Errorf("%s counted %d times, want 0", key, got)
		}
	}
}
