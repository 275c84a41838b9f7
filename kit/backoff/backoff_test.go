package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDoubling(t *testing.T) {
	for _, tc := range []struct {
		base, max time.Duration
		n         int
		want      time.Duration
	}{
		{time.Second, time.Minute, 0, time.Second},
		{time.Second, time.Minute, 3, 8 * time.Second},
		{time.Second, 10 * time.Second, 5, 10 * time.Second},
		{time.Second, 10 * time.Second, 1 << 20, 10 * time.Second}, // no overflow
		{0, time.Minute, 5, 0},
	} {
		if got := Doubling(tc.base, tc.max, tc.n); got != tc.want {
			t.Errorf("Doubling(%v, %v, %d) = %v, want %v", tc.base, tc.max, tc.n, got, tc.want)
		}
	}
}

func TestJittered(t *testing.T) {
	for range 1000 {
		d := Jittered(10*time.Second, 11*time.Second, 0.2)
		if d < 8*time.Second || d > 11*time.Second {
			t.Fatalf("Jittered(10s, 11s, 0.2) = %v", d)
		}
	}
}

// Retry gives up when its context ends, with f's error, and stops calling
// f once it succeeds.
func TestRetry(t *testing.T) {
	calls := 0
	err := Retry(context.Background(), time.Millisecond, 4*time.Millisecond, func() error {
		if calls++; calls < 4 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 4 {
		t.Errorf("Retry = %v after %d calls, want nil after 4", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	boom := errors.New("boom")
	if err := Retry(ctx, time.Hour, time.Hour, func() error { return boom }); !errors.Is(err, boom) || !errors.Is(err, context.Canceled) {
		t.Errorf("Retry on an ended context = %v", err)
	}
}
