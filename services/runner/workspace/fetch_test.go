package workspace

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A caller that asks while a fetch runs does not join it: it waits for the
// next one, which every caller that asked meanwhile shares.
func TestFetcherWaitsForAFetchStartedAfterAsking(t *testing.T) {
	var (
		f       fetcher
		mu      sync.Mutex
		started int
	)
	// Fetch 0 waits for gates[0], every later one for gates[1].
	gates := []chan struct{}{make(chan struct{}), make(chan struct{})}
	begun := make(chan int, 10)
	do := func(context.Context) error {
		mu.Lock()
		n := started
		started++
		mu.Unlock()
		begun <- n
		<-gates[min(n, 1)]
		return nil
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.fetch(ctx, time.Time{}, do) })
	if n := <-begun; n != 0 {
		t.Fatalf("fetch %d began first", n)
	}

	// Five callers ask while fetch 0 runs.
	const waiters = 5
	results := make(chan int, waiters)
	for range waiters {
		wg.Go(func() {
			if err := f.fetch(ctx, time.Time{}, do); err != nil {
				t.Error(err)
			}
			mu.Lock()
			results <- started
			mu.Unlock()
		})
	}
	// They wait for the pending flight, not for fetch 0.
	waitUntil(t, &f, func() bool { return f.pending != nil })
	select {
	case r := <-results:
		t.Fatalf("a caller returned while the fetch it did not see start was running (%d fetches)", r)
	case <-time.After(50 * time.Millisecond):
	}
	close(gates[0])
	if n := <-begun; n != 1 {
		t.Fatalf("fetch %d began second", n)
	}
	close(gates[1])
	wg.Wait()
	close(results)
	// All share fetch 1; a caller slow to ask (a loaded machine) may
	// have to wait for a fetch 2, never return after fetch 0 only.
	for r := range results {
		if r < 2 {
			t.Errorf("a caller returned after %d fetches had started, want at least 2", r)
		}
	}
	if started > 3 {
		t.Errorf("%d fetches for %d callers, want 2 (at most 3)", started, waiters+1)
	}
}

// The fetch of a caller whose context ends is not taken as a result by
// the callers that joined it: they fetch again.
func TestFetcherAbandonedFetchIsRetried(t *testing.T) {
	var f fetcher
	release := make(chan struct{})
	var calls sync.WaitGroup
	// Fetch 0 runs while two callers form the pending flight.
	calls.Go(func() {
		_ = f.fetch(context.Background(), time.Time{}, func(context.Context) error { <-release; return nil })
	})
	waitUntil(t, &f, func() bool { return f.running != nil })

	// Whichever of the two runs the pending fetch is cancelled in it; the
	// other must fetch again and succeed.
	var (
		mu      sync.Mutex
		fetches int
		leader  = -1
	)
	leading := make(chan struct{})
	ctxs, cancels, errs := make([]context.Context, 2), make([]context.CancelFunc, 2), make([]error, 2)
	for i := range 2 {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
		defer cancels[i]()
		calls.Go(func() {
			errs[i] = f.fetch(ctxs[i], time.Time{}, func(ctx context.Context) error {
				mu.Lock()
				fetches++
				first := leader == -1
				if first {
					leader = i
				}
				mu.Unlock()
				if !first {
					return nil
				}
				close(leading)
				<-ctx.Done()
				return ctx.Err()
			})
		})
	}
	// Both join the pending flight before fetch 0 ends.
	waitUntil(t, &f, func() bool { return f.pending != nil && f.pending.joined == 2 })
	close(release)
	<-leading
	cancels[leader]()
	calls.Wait()
	other := 1 - leader
	if !errors.Is(errs[leader], context.Canceled) {
		t.Errorf("cancelled leader got %v", errs[leader])
	}
	if errs[other] != nil || fetches != 2 {
		t.Errorf("joiner got %v after %d fetches in all, want nil after 2", errs[other], fetches)
	}
}

// waitUntil polls cond under f.mu.
func waitUntil(t *testing.T, f *fetcher, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		ok := cond()
		f.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// A job whose event came before a fetch that succeeded needs no fetch of
// its own; one whose event came after it, or after a failed one, does.
func TestFetchSkippedOnlyAfterAFetchThatStartedLater(t *testing.T) {
	var (
		f     fetcher
		calls int
		fail  bool
	)
	do := func(context.Context) error {
		calls++
		if fail {
			return errors.New("remote away")
		}
		return nil
	}
	ctx := context.Background()
	event := time.Now().Add(-time.Millisecond) // an event a moment ago
	if err := f.fetch(ctx, event, do); err != nil || calls != 1 {
		t.Fatalf("first fetch: err %v, %d calls, want nil, 1", err, calls)
	}
	if err := f.fetch(ctx, event, do); err != nil || calls != 1 {
		t.Errorf("job of an event before the last fetch: err %v, %d calls, want nil and no fetch", err, calls)
	}
	if err := f.fetch(ctx, time.Now(), do); err != nil || calls != 2 {
		t.Errorf("job of an event after the last fetch: err %v, %d calls, want a fetch", err, calls)
	}
	if err := f.fetch(ctx, time.Time{}, do); err != nil || calls != 3 {
		t.Errorf("job with no event time: err %v, %d calls, want a fetch", err, calls)
	}
	fail = true
	later := time.Now()
	if err := f.fetch(ctx, later, do); err == nil {
		t.Error("failed fetch reported no error")
	}
	fail = false
	if err := f.fetch(ctx, later, do); err != nil || calls != 5 {
		t.Errorf("after a failed fetch: err %v, %d calls, want a new fetch", err, calls)
	}
}
