package workspace

import (
	"context"
	"sync"
	"time"
)

// fetcher coalesces the fetches of one project's clone.
//
// A job must see the remote as it was when the job's event happened (its
// since), so it cannot simply join a fetch that is already running: that
// fetch may have read the remote's refs before the job's commit was
// pushed. A fetch that succeeded and started after since is enough,
// though: a job that waited in the queue while other jobs fetched needs no
// fetch of its own. Otherwise a job that finds a fetch running waits for
// the next one, which starts when the running one ends and serves every
// job that asked in the meantime. So under load there are at most two
// fetches in the air per project (one running, one pending), however many
// jobs ask, and each job's fetch started after its since.
type fetcher struct {
	mu sync.Mutex
	// running is the fetch in progress, nil when none is.
	running *flight
	// pending is the fetch that starts when running ends, nil when nobody
	// waits for one. Whoever finds running nil with a pending flight
	// starts that flight, so the jobs already waiting for it are served.
	pending *flight
	// last is when the latest successful fetch started.
	last time.Time
}

// flight is one fetch; done closes when it has ended with err.
type flight struct {
	done    chan struct{}
	err     error
	started time.Time
	// abandoned: the fetch was cut short because the context of the job
	// running it ended. It says nothing about the remote, so the other
	// jobs that joined it ask again.
	abandoned bool
	// joined counts the callers that joined the flight while it was
	// pending, under the fetcher's mutex: what a test waits for.
	joined int
}

// fetch returns the result of a call of do that started after since,
// running do itself or joining a call another goroutine started, or nil
// at once when a successful one did. A zero since is the time of the call.
// do runs under the context of the caller that runs it.
func (f *fetcher) fetch(ctx context.Context, since time.Time, do func(context.Context) error) error {
	f.mu.Lock()
	fresh := !since.IsZero() && f.last.After(since)
	f.mu.Unlock()
	if fresh {
		return nil
	}
	for {
		fl, lead := f.join()
		if lead {
			return f.run(ctx, fl, do)
		}
		// Another fetch is running: wait for it to end, then start ours
		// unless a goroutine that also waits for it did so first.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.ahead(fl):
		}
		if f.promote(fl) {
			return f.run(ctx, fl, do)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-fl.done:
		}
		if !fl.abandoned {
			return fl.err
		}
	}
}

// join returns the flight the caller is to use: a new one it is to run
// (lead) when no fetch is running, else the pending one, made if needed.
func (f *fetcher) join() (fl *flight, lead bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running == nil {
		// A pending flight is due now: run it, it serves the caller too.
		fl = f.pending
		if fl == nil {
			fl = &flight{done: make(chan struct{})}
		}
		f.running, f.pending = fl, nil
		return fl, true
	}
	if f.pending == nil {
		f.pending = &flight{done: make(chan struct{})}
	}
	f.pending.joined++
	return f.pending, false
}

// ahead returns a channel that closes when the fetch running ahead of the
// pending flight fl has ended, or at once when fl is no longer pending.
func (f *fetcher) ahead(fl *flight) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending != fl || f.running == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return f.running.done
}

// promote makes the pending flight fl the running one if no fetch runs,
// reporting whether the caller is to run it.
func (f *fetcher) promote(fl *flight) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending != fl || f.running != nil {
		return false
	}
	f.running, f.pending = fl, nil
	return true
}

// run runs do for fl, which the caller has made the running flight, and
// publishes its result.
func (f *fetcher) run(ctx context.Context, fl *flight, do func(context.Context) error) error {
	fl.started = time.Now()
	err := do(ctx)
	f.mu.Lock()
	fl.err, fl.abandoned = err, err != nil && ctx.Err() != nil
	if err == nil && fl.started.After(f.last) {
		f.last = fl.started
	}
	f.running = nil
	f.mu.Unlock()
	close(fl.done)
	return err
}
