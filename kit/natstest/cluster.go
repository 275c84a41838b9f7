package natstest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/freeport"
)

// TestCluster is a JetStream cluster in the test's process: three nodes,
// each with its own store, routed to one another as deployments/nats's
// configs are. A node can be shut down and started again on its address
// and store, as a crashed server would come back; streams made with
// Replicas 3 keep their quorum while one node is down.
type TestCluster struct {
	Nodes []*embedded.Server
	// Names are the nodes' server names, nats-1 first: the names
	// JetStream gives a stream's leader and replicas.
	Names []string
}

// Cluster starts a three-node cluster on free loopback ports, waits until
// it has a meta leader, and shuts it down when the test ends.
func Cluster(t testing.TB) *TestCluster {
	t.Helper()
	// The nodes need their route ports before any of them starts, so
	// Port -1 will not do.
	ports, err := freeport.Loopback(6)
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	for _, p := range ports[3:] {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(p))
	}
	c := &TestCluster{}
	for i := range 3 {
		name := fmt.Sprintf("nats-%d", i+1)
		s, err := embedded.Start(embedded.Options{
			Host: "127.0.0.1", Port: ports[i], StoreDir: t.TempDir(),
			ServerName: name, ClusterName: "orch", ClusterPort: ports[3+i], Routes: routes,
		})
		if err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		t.Cleanup(s.Shutdown)
		c.Nodes, c.Names = append(c.Nodes, s), append(c.Names, name)
	}
	nc, js := c.Connect(t)
	defer nc.Close()
	CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx) // answered only once there is a meta leader
		return err
	})
	return c
}

// URL lists every node, comma-separated, as ORCH_NATS_URL names a cluster.
func (c *TestCluster) URL() string {
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// Connect connects a client to every node (it moves to another when its
// node goes away); the caller closes it.
func (c *TestCluster) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Node returns the node named name (nats-1 ...).
func (c *TestCluster) Node(t testing.TB, name string) *embedded.Server {
	t.Helper()
	for i, n := range c.Names {
		if n == name {
			return c.Nodes[i]
		}
	}
	t.Fatalf("no node %q among %v", name, c.Names)
	return nil
}

// StreamLeader waits until stream has a leader and names its node.
func (c *TestCluster) StreamLeader(t testing.TB, js jetstream.JetStream, stream string) string {
	t.Helper()
	var leader string
	CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		if cl := s.CachedInfo().Cluster; cl != nil && cl.Leader != "" {
			leader = cl.Leader
			return nil
		}
		return fmt.Errorf("stream %s has no leader", stream)
	})
	return leader
}
