// Package writeback tells the tracker a job came from how it is going:
// one tracking comment per job on the Gitea pull request or the Plane
// work item, edited in place as the job runs, and a Gitea commit status on
// the pull request's head.
//
// Every notifier watches the status bucket (KV jobs) and keeps, per job
// it has something to write for, the latest record it saw. Notifiers
// coordinate through a record per job in the bucket proto.BucketWriteback,
// written only by compare-and-set: it holds a lease (one notifier writes
// a job at a time), the comment's id, what was last written and the
// status revision that is shown in full. This was chosen over a durable
// consumer on the bucket's stream shared by the notifiers: such a
// consumer hands successive updates of one job to different notifiers,
// which would still need a per-job lock to create one comment, and
// coalescing would mean holding messages unacked. The record gives the
// lock, the coalescing clock and the memory of what was written in one
// place, and it survives restarts of every notifier.
//
// It never writes a second comment for a job: the record names the
// comment once it exists; a create whose answer was lost is found again
// before the next create, on Gitea by the hidden marker in its body
// (proto.CommentMarker), on Plane by external_id, which Plane refuses to
// take twice (409 naming the first comment). It never loses the last
// state: the watch starts with the latest record of every job, and a job
// whose write-back record shows an older revision is written again, so
// after an outage of a tracker or of every notifier the comment ends up
// showing the final state.
package writeback

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/scrub"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/alert"
)

// Defaults of the write-back settings.
const (
	// MinEditDefault is the least time between two writes about one job:
	// rapid changes are coalesced into the state at the end of it.
	MinEditDefault = 3 * time.Second
	// RetryDelayDefault is the first wait after a tracker failed (5xx,
	// 429 without Retry-After, network); it doubles per failure.
	RetryDelayDefault = 2 * time.Second
	// RetryMaxDelayDefault caps the doubling wait.
	RetryMaxDelayDefault = 5 * time.Minute
	// RejectedDelayDefault is the wait after a tracker refused a request
	// (401, 403, 422): only an operator can fix that.
	RejectedDelayDefault = 5 * time.Minute
	// LeaseDefault is how long a notifier holds a job it writes; another
	// notifier takes the job over when a holder died.
	LeaseDefault = time.Minute
	// WorkersDefault is how many jobs are written at once.
	WorkersDefault = 4
)

// Config is the write-back's configuration.
type Config struct {
	// Gitea and Plane are the trackers' clients; nil for one not set up.
	Gitea *Gitea
	Plane *Plane
	// PlaneRuns posts the activities of Plane agent runs (projects with
	// plane_agent_app); nil for none. A job of a run gets no tracking
	// comment: the run's response is its answer in the thread.
	PlaneRuns *PlaneRuns
	// ActionEvery is the least time between two action activities on one
	// run; zero means ActionEveryDefault.
	ActionEvery time.Duration
	// Registry returns the current project registry.
	Registry func() *registry.Registry
	// PublicURL is the gateway's base URL: links go to /ui/jobs/{id}.
	PublicURL string
	// Name identifies this notifier in leases. Default: host name and a
	// random suffix.
	Name string
	// QueuedAfter is how long a job may wait in the queue before its
	// comment is created; a job that starts running sooner gets its
	// comment then. Zero comments on every job as soon as it is queued.
	QueuedAfter time.Duration
	// MinEdit, RetryDelay, RetryMaxDelay, RejectedDelay, Lease and
	// Workers default to the constants above.
	MinEdit, RetryDelay, RetryMaxDelay, RejectedDelay, Lease time.Duration
	Workers                                                  int
	// Scrubber cleans what came from the agent's run.
	Scrubber scrub.Scrubber
	// LogTail returns the end of the readable log of a job's last
	// attempt. Default: the runner's log file, where it is readable here.
	LogTail func(ctx context.Context, st *proto.Status) string
	// Recorder counts the writes; nil counts nothing.
	Recorder Recorder
}

func (c *Config) setDefaults() {
	c.MinEdit = cmp.Or(c.MinEdit, MinEditDefault)
	c.RetryDelay = cmp.Or(c.RetryDelay, RetryDelayDefault)
	c.RetryMaxDelay = cmp.Or(c.RetryMaxDelay, RetryMaxDelayDefault)
	c.RejectedDelay = cmp.Or(c.RejectedDelay, RejectedDelayDefault)
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.Workers = cmp.Or(c.Workers, WorkersDefault)
	c.ActionEvery = cmp.Or(c.ActionEvery, ActionEveryDefault)
	if c.LogTail == nil {
		c.LogTail = func(_ context.Context, st *proto.Status) string { return alert.LogTail(st.Log, LogTailLines) }
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Name = cmp.Or(host, "notifier") + "-" + hex.EncodeToString(b[:])
	}
}

// Writer writes job states back to the trackers.
type Writer struct {
	cfg  Config
	log  *zap.Logger
	jobs jetstream.KeyValue
	recs records

	mu      sync.Mutex
	entries map[string]*entry
	wake    chan struct{}
}

// entry is a job with something left to write.
type entry struct {
	st    *proto.Status
	rev   uint64
	due   time.Time
	busy  bool
	fails int
}

// New ensures the write-back bucket and returns a Writer over the status
// bucket jobs.
func New(ctx context.Context, js jetstream.JetStream, jobs jetstream.KeyValue, topo proto.Topology, cfg Config, log *zap.Logger) (*Writer, error) {
	cfg.setDefaults()
	if cfg.Registry == nil {
		return nil, errors.New("writeback: no registry")
	}
	var kv jetstream.KeyValue
	if err := service.Retry(ctx, log, "ensuring bucket "+proto.BucketWriteback, func(ctx context.Context) (err error) {
		kv, err = proto.EnsureBucket(ctx, js, topo.WritebackBucket())
		return err
	}); err != nil {
		return nil, err
	}
	return &Writer{cfg: cfg, log: log, jobs: jobs, recs: records{kv}, entries: map[string]*entry{}, wake: make(chan struct{}, 1)}, nil
}

// Run writes back until ctx ends: a watch of the status bucket feeds the
// jobs, a dispatcher hands due jobs to Workers workers.
func (w *Writer) Run(ctx context.Context) {
	w.log.Info("tracker write-back started", zap.Bool("gitea", w.cfg.Gitea != nil), zap.Bool("plane", w.cfg.Plane != nil),
		zap.String("name", w.cfg.Name), zap.Duration("queued_after", w.cfg.QueuedAfter))
	work := make(chan string)
	var wg sync.WaitGroup
	wg.Go(func() { w.watch(ctx) })
	for range w.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-work:
					w.handle(ctx, id)
				}
			}
		})
	}
	w.dispatch(ctx, work)
	wg.Wait()
}

// watch feeds every status record into the entries, starting with the
// latest of each job, and starts again when the watch ends.
func (w *Writer) watch(ctx context.Context) {
	for ctx.Err() == nil {
		wt, err := w.jobs.WatchAll(ctx)
		if err != nil {
			w.log.Warn("watching job records, will retry", zap.Error(err))
			backoff.Sleep(ctx, time.Second)
			continue
		}
		w.follow(ctx, wt)
		_ = wt.Stop()
	}
}

func (w *Writer) follow(ctx context.Context, wt jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-wt.Updates():
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			st, err := proto.DecodeStatus(e.Value())
			if err != nil || st.Job.ID != e.Key() {
				continue
			}
			if w.wants(st) {
				w.offer(st, e.Revision())
			}
		}
	}
}

// wants reports whether st's job has a place to write to.
func (w *Writer) wants(st *proto.Status) bool {
	if st.Job.Kind == proto.KindCleanup {
		return false
	}
	p, ok := w.cfg.Registry().ByKey(st.Job.Project)
	return ok && w.targetsOf(p, &st.Job).any()
}

// offer records a newer state of a job and makes it due now, unless it
// waits for a backoff.
func (w *Writer) offer(st *proto.Status, rev uint64) {
	w.mu.Lock()
	e := w.entries[st.Job.ID]
	if e == nil {
		e = &entry{}
		w.entries[st.Job.ID] = e
	}
	if rev > e.rev {
		e.st, e.rev = st, rev
		if e.fails == 0 {
			e.due = time.Now()
		}
	}
	w.mu.Unlock()
	w.poke()
}

// poke wakes the dispatcher to look at the entries again.
func (w *Writer) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// dispatch hands the due jobs to the workers, one worker per job at a
// time, until ctx ends.
func (w *Writer) dispatch(ctx context.Context, work chan<- string) {
	for {
		id, wait := w.next()
		if id != "" {
			select {
			case work <- id:
				continue
			case <-ctx.Done():
				return
			}
		}
		// Not a backoff.Sleep: a changed record (poke) ends the wait
		// early. The entries' own waits are backoff.Doubling's (see
		// Writer.backoff).
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-w.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// next returns a due job, marked busy, or how long until one is due.
func (w *Writer) next() (string, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now, wait := time.Now(), time.Minute
	var best string
	var bestDue time.Time
	for id, e := range w.entries {
		if e.busy {
			continue
		}
		if !e.due.After(now) && (best == "" || e.due.Before(bestDue)) {
			best, bestDue = id, e.due
		}
		wait = min(wait, e.due.Sub(now))
	}
	if best != "" {
		w.entries[best].busy = true
	}
	return best, max(wait, time.Millisecond)
}

// handle writes one job and schedules what is left.
func (w *Writer) handle(ctx context.Context, id string) {
	w.mu.Lock()
	e := w.entries[id]
	st, rev, fails := e.st, e.rev, e.fails
	w.mu.Unlock()

	out := w.sync(ctx, st, rev, fails)
	defer w.poke()

	w.mu.Lock()
	defer w.mu.Unlock()
	e.busy = false
	if out.failed {
		e.fails++
	} else {
		e.fails = 0
	}
	switch {
	case e.rev > rev && !out.failed:
		// A newer state came meanwhile: look at it now. out.next was
		// worked out for the older state (a queued job's wait for its
		// comment, say) and does not hold for the new one; sync itself
		// waits out the coalescing pause and another notifier's lease.
		e.due = time.Now()
	case out.next.IsZero():
		delete(w.entries, id)
	default:
		e.due = out.next
	}
}

// jobURL is the job's page in the dashboard, or "".
func (w *Writer) jobURL(id string) string {
	if w.cfg.PublicURL == "" {
		return ""
	}
	return strings.TrimRight(w.cfg.PublicURL, "/") + "/ui/jobs/" + id
}

// backoff is the wait after the n-th failure in a row (from 0).
func (w *Writer) backoff(n int) time.Duration {
	return backoff.Doubling(w.cfg.RetryDelay, w.cfg.RetryMaxDelay, n)
}
