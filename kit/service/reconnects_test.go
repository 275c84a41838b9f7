package service

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/natstest"
)

// A server's restart closes the channel Next gave before it, and Next
// then gives a fresh one for the reconnect after.
func TestReconnectsHearOfARestart(t *testing.T) {
	t.Parallel()
	s := natstest.Server(t)
	rc := NewReconnects()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	nc, _, _, err := Connect(ctx, Common{NATSURL: s.URL()}, "gateway", rc, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	before := rc.Next()
	select {
	case <-before:
		t.Fatal("closed before any reconnect")
	default:
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-before:
	case <-ctx.Done():
		t.Fatal("no reconnect heard after the server restarted")
	}
	select {
	case <-rc.Next():
		t.Fatal("the next channel is closed already")
	default:
	}
	var none *Reconnects
	if none.Next() != nil {
		t.Error("a nil Reconnects gave a channel")
	}
}
