package natscluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// routes is how many route connections server s holds, from /routez.
func routes(t *testing.T, s *Server) int {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(s.httpPort) + "/routez")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rz struct {
		NumRoutes int `json:"num_routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rz); err != nil {
		t.Fatal(err)
	}
	return rz.NumRoutes
}

// A partitioned server keeps its clients but has no route to the others,
// and the other two go on with an R3 stream; healed, it catches up. A
// server SIGKILLed and restarted rejoins.
func TestPartitionAndKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and starts three")
	}
	// The build has its own deadline: cold, beside the other packages'
	// tests on two cores, it took over two minutes in CI, and the
	// cluster's steps must not inherit what is left of it.
	dir := t.TempDir()
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Minute)
	bin, err := Build(bctx, dir)
	bcancel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pw := map[string]string{}
	for _, u := range natsauth.Users() {
		pw[u] = "pw-" + u
	}
	c, err := Start(ctx, Options{Bin: bin, Dir: dir, Passwords: pw})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	nc, err := nats.Connect(c.URL(), nats.UserInfo(natsauth.Admin, pw[natsauth.Admin]), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nats.Connect(c.URL(), nats.MaxReconnects(0)); err == nil {
		t.Error("an anonymous client was let in")
	}
	js, _ := jetstream.New(nc)
	// Each try has its own deadline: a request the cluster does not
	// answer (no meta leader yet) would otherwise wait out ctx.
	natstest.CheckFor(t, time.Minute, 250*time.Millisecond, func() error {
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		defer tcancel()
		_, err := js.CreateStream(tctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3})
		return err
	})

	one := c.Servers()[0]
	c.Partition(one, true)
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		for _, s := range c.Servers() {
			want := 2 // the others: a route pool each, counted as connections
			if s == one {
				want = 0
			}
			if n := routes(t, s); (want == 0) != (n == 0) {
				return fmt.Errorf("%s has %d routes during the partition", s.Name, n)
			}
		}
		return nil
	})
	// The majority takes writes; clients on the cut server may not.
	other, err := nats.Connect(c.Servers()[1].URL(), nats.UserInfo(natsauth.Admin, pw[natsauth.Admin]))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ojs, _ := jetstream.New(other)
	natstest.CheckFor(t, 30*time.Second, 250*time.Millisecond, func() error {
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		defer tcancel()
		_, err := ojs.Publish(tctx, "s", []byte("during"))
		return err
	})
	c.Partition(one, false)
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}

	c.Kill(one)
	if one.Running() {
		t.Fatal("killed server still running")
	}
	if err := c.Restart(one); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	if routes(t, one) == 0 {
		t.Error("restarted server has no routes")
	}
}
