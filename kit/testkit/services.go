package testkit

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// Services runs each of services (a name and its Run) until the test
// ends, with a context cancelled then, and fails the test with any error
// but that context's. It is how a test starts the whole system, or a part
// of it, in its own process.
func Services(t testing.TB, services map[string]func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for name, run := range services {
		wg.Go(func() {
			if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
}
