package writeback

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/trackertest"
	"github.com/orch-dev/orch/proto"
)

// A job from a webhook carries its head sha, and its commit status goes on
// that commit, which outlives a pull request an admin deleted; Gitea then
// answers 500, not 404, to listing or adding the deleted pull request's
// comments. The write-back still sees that the pull request is gone and
// stops that job for good with one warning, instead of retrying forever.
func TestDeletedPullRequestStopsAfterItsStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.writer("n1")
	b.start("n1")
	job := b.prJob("deleted", 40)
	job.Task.HeadSHA = fmt.Sprintf("%040x", 40)
	b.gitea.DeletePR(repo, 40)
	b.set(job, running(1))
	b.settle(w, job)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := b.logs.FilterMessageSnippet("write-back stopped").FilterField(zap.String("job", job.ID)).Len(); n != 1 {
			return fmt.Errorf("%d log lines say the job's write-back stopped, want 1", n)
		}
		return nil
	})
	if n := b.logs.FilterMessageSnippet("will retry").FilterField(zap.String("job", job.ID)).Len(); n != 0 {
		t.Errorf("the deleted pull request's job was retried %d times", n)
	}
	if st := b.gitea.Statuses(job.Task.HeadSHA); len(st) != 1 || st[0].State != "pending" {
		t.Errorf("statuses on the head %+v, want the one pending Gitea took", st)
	}
	if n := len(b.gitea.Comments(repo, 40)); n != 0 {
		t.Errorf("deleted pull request has %d comments", n)
	}
}

// A job that starts running while the write-back is still busy with its
// queued state (setting the pending status) gets its comment as soon as
// the coalescing pause allows, not when a queued job's comment would have
// been due (QueuedAfter, an hour here): on a free runner that is every
// job, and the comment would otherwise skip "running" altogether.
func TestRunningWhileQueuedIsWrittenShowsRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.writer("n1")
	job := b.prJob("quick", 41)
	var once sync.Once
	b.gitea.SetFault(func(r *http.Request, route string, n int) *trackertest.Fault {
		if r.Method != http.MethodPost || !strings.HasSuffix(route, "/statuses/{sha}") {
			return nil
		}
		// The pending status is on its way: the runner starts the job now,
		// and the writer sees it before this answer returns.
		once.Do(func() {
			b.set(job, running(1))
			_, rev, err := b.status.Get(b.ctx, job.ID)
			if err != nil {
				return
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !seen(w, job.ID, rev); {
				time.Sleep(5 * time.Millisecond) // polls the writer's own entries; no event to wait on
			}
		})
		return nil
	})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	b.set(job, func(*proto.Status) {})
	b.waitComment(41, "orch · review · running")
}

// seen reports whether w has taken in revision rev of job id's record.
func seen(w *Writer, id string, rev uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[id]
	return e != nil && e.rev >= rev
}
