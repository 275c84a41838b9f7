package queue

import (
	"context"
	"sync"
)

// inflight tracks the writes that follow a job's publish (see supersede):
// their owner waits for all of them, a reader of one job for its own.
type inflight struct {
	wg sync.WaitGroup

	mu   sync.Mutex
	jobs map[string]*pending
}

// pending is one job's writes in flight: a job published twice at once
// (two deliveries of one event) has two.
type pending struct {
	n    int
	done chan struct{}
}

// write runs w, the writes that follow job id's publish, in a goroutine
// of its own.
func (f *inflight) write(id string, w func()) {
	f.mu.Lock()
	if f.jobs == nil {
		f.jobs = map[string]*pending{}
	}
	p := f.jobs[id]
	if p == nil {
		p = &pending{done: make(chan struct{})}
		f.jobs[id] = p
	}
	p.n++
	f.mu.Unlock()
	f.wg.Go(func() {
		defer func() {
			f.mu.Lock()
			if p.n--; p.n == 0 {
				delete(f.jobs, id)
				close(p.done)
			}
			f.mu.Unlock()
		}()
		w()
	})
}

// waitAll returns once the writes in flight now are done, or ctx ended.
func (f *inflight) waitAll(ctx context.Context) {
	f.mu.Lock()
	dones := make([]chan struct{}, 0, len(f.jobs))
	for _, p := range f.jobs {
		dones = append(dones, p.done)
	}
	f.mu.Unlock()
	for _, done := range dones {
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}

// wait returns once job id has no write in flight, or ctx ended.
func (f *inflight) wait(ctx context.Context, id string) {
	f.mu.Lock()
	p := f.jobs[id]
	f.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p.done:
	case <-ctx.Done():
	}
}
