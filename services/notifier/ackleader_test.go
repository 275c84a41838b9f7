package notifier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
)

// An advisory acked while its consumer's leader is lost (the member that
// led it SIGKILLed, say) gets no answer until a new leader is elected; the
// ack is tried again until it is confirmed, instead of leaving the
// advisory unacked to hold back every later alert (MaxAckPending 1) until
// ackWait brings it back. make soak-cluster found 30 s without alerts for
// each such election.
func TestAckSurvivesConsumerLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := natstest.Cluster(t)
	nc, js := c.Connect(t)
	defer nc.Close()
	ctx := context.Background()
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ADV", Subjects: []string{"adv"}, Replicas: 3})
		return err
	})
	cons, err := js.CreateOrUpdateConsumer(ctx, "ADV", jetstream.ConsumerConfig{
		Durable: "notifier", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "adv", []byte("advisory")); err != nil {
		t.Fatal(err)
	}
	// The notifier's own server led the consumer: its connection moves
	// to another while the others elect a new leader.
	leader := cons.CachedInfo().Cluster.Leader
	down := c.Node(t, leader)
	urls := []string{down.URL()}
	for _, n := range c.Nodes {
		if n != down {
			urls = append(urls, n.URL())
		}
	}
	lnc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lnc.Close()
	ljs, _ := jetstream.New(lnc)
	lcons, err := ljs.Consumer(ctx, "ADV", "notifier")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := lcons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	down.Shutdown()

	start := time.Now()
	if err := ackConfirmed(ctx, msg, ackWait/2); err != nil {
		t.Fatalf("ack not confirmed %v after %s (the consumer's leader) went down: %v", time.Since(start), leader, err)
	}
	// The new leader holds the ack: nothing waits for redelivery.
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		info, err := cons.Info(ictx)
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.AckFloor.Stream != 1 {
			return fmt.Errorf("consumer on %s: %d pending acks, ack floor %d", info.Cluster.Leader, info.NumAckPending, info.AckFloor.Stream)
		}
		return nil
	})
}

// A shutdown stops the retries of an ack.
func TestAckRetriesEndWithTheContext(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := natstest.Cluster(t)
	nc, js := c.Connect(t)
	defer nc.Close()
	ctx := context.Background()
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ADV", Subjects: []string{"adv"}, Replicas: 3})
		return err
	})
	cons, err := js.CreateOrUpdateConsumer(ctx, "ADV", jetstream.ConsumerConfig{Durable: "notifier", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "adv", []byte("advisory")); err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Two of three down: no leader can be elected, no ack answered.
	for _, n := range c.Nodes[1:] {
		n.Shutdown()
	}
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	start := time.Now()
	err = ackConfirmed(stopped, msg, time.Minute)
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("ack with no leader = %v, want the try's own error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("ack retried for %v after the shutdown", d)
	}
}
