// Package natstest gives tests a real JetStream server on a random port
// with a temporary store, and a polling helper instead of sleeps.
package natstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/proto"
)

// Server starts an embedded JetStream server for the test and shuts it
// down when the test ends.
func Server(t testing.TB) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// AuthServer is Server with natsauth's users, each allowed what its
// service may do and logged in with the password Password(user).
func AuthServer(t testing.TB) *embedded.Server {
	t.Helper()
	pw := map[string]string{}
	for _, u := range natsauth.Users() {
		pw[u] = Password(u)
	}
	return AuthServerWith(t, pw)
}

// AuthServerWith is AuthServer with the passwords pw, by user.
func AuthServerWith(t testing.TB, pw map[string]string) *embedded.Server {
	t.Helper()
	users, err := embedded.Users(pw)
	if err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir(), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Password is user's password on an AuthServer: "pw-<user>".
func Password(user string) string { return "pw-" + user }

// Connect connects a client to s, ensures orch's topology and returns the
// JetStream handle and the status bucket. The connection closes with the
// test.
func Connect(t testing.TB, s *embedded.Server) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, Ensure(context.Background(), t, js, proto.Topology{})
}

// Ensure ensures topo as the services do, each attempt with a deadline
// of its own, for up to a minute within ctx, and returns the status
// bucket: a test's services ensure it at the same moment, and
// nats-server can leave one of two concurrent creates of a stream
// without an answer (seen in CI, where a single 10 s request timed out
// while the gateway's finished in 60 ms; the services retry the same way,
// see service.Retry); a cluster may still be electing leaders.
func Ensure(ctx context.Context, t testing.TB, js jetstream.JetStream, topo proto.Topology) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var kv jetstream.KeyValue
	err := backoff.Retry(ctx, 100*time.Millisecond, 100*time.Millisecond, func() error {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var err error
		if kv, err = topo.Ensure(actx, js); err != nil {
			t.Logf("ensuring the topology, will retry: %v", err)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// JetStream starts a server for the test (Server), connects to it
// (Connect) and returns the JetStream handle and the status bucket: the
// opening of every test that needs neither the server nor the connection
// itself.
func JetStream(t testing.TB) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	_, js, kv := Connect(t, Server(t))
	return js, kv
}

// CheckFor calls f every interval until it returns nil, and fails the test
// with f's last error when timeout passes first.
func CheckFor(t testing.TB, timeout, interval time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(interval)
	}
}

// Messages returns every message stream holds, oldest first, skipping
// the deleted ones; it fails the test when the stream cannot be read.
func Messages(t testing.TB, js jetstream.JetStream, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			t.Fatalf("%s message %d: %v", stream, seq, err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}
