package service

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// NotifyHUP starts delivering SIGHUP (reload the registry) to the returned
// channel, at once, so that none sent once the service is up is lost;
// stop ends the delivery.
func NotifyHUP() (hup <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	return c, func() { signal.Stop(c) }
}

// OnSignal calls f for every signal on c until ctx ends.
func OnSignal(ctx context.Context, c <-chan os.Signal, f func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c:
			f()
		}
	}
}
