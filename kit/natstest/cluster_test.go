package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
)

// The cluster keeps an R3 stream through the loss of its leader's node:
// another node leads it and takes writes, and the node started again on
// its store catches up.
func TestClusterSurvivesALeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := natstest.Cluster(t)
	nc, js := c.Connect(t)
	defer nc.Close()
	ctx := context.Background()
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3})
		return err
	})
	leader := c.StreamLeader(t, js, "S")
	down := c.Node(t, leader)
	down.Shutdown()
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "s", []byte("while one is down"))
		return err
	})
	if l := c.StreamLeader(t, js, "S"); l == leader {
		t.Errorf("%s still leads S while down", l)
	}
	if err := down.Start(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		s, err := js.Stream(ctx, "S")
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				return fmt.Errorf("replica %s of S not current", r.Name)
			}
		}
		if len(info.Cluster.Replicas) != 2 || info.State.Msgs != 1 {
			return fmt.Errorf("S: %+v, %d messages", info.Cluster, info.State.Msgs)
		}
		return nil
	})
}
