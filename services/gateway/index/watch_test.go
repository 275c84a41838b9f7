package index

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
)

// setupIndex returns an index and a status bucket whose records expire
// after ttl, on a real JetStream server.
func setupIndex(t *testing.T, ttl time.Duration) (*Index, jetstream.KeyValue) {
	t.Helper()
	js, _ := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "jobs_ttl", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return New(), kv
}

// watch runs ix.Watch until the returned stop is called.
func watch(t *testing.T, ix *Index, kv jetstream.KeyValue) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ix.Watch(ctx, kv, nil, zap.NewNop()) })
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

func queuedRecord(t *testing.T, id string) []byte {
	t.Helper()
	data, err := json.Marshal(proto.Status{Schema: proto.SchemaVersion, State: proto.StateQueued,
		Job: proto.Job{ID: id, Kind: proto.KindReview, Project: "p", Task: proto.Task{ID: "t-" + id}}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func putQueued(t *testing.T, kv jetstream.KeyValue, id string) {
	t.Helper()
	if _, err := kv.Put(context.Background(), id, queuedRecord(t, id)); err != nil {
		t.Fatal(err)
	}
}

func wantQueued(t *testing.T, ix *Index, n int, within time.Duration) {
	t.Helper()
	natstest.CheckFor(t, within, 20*time.Millisecond, func() error {
		if got := ix.Counts()[proto.StateQueued]; got != n {
			return fmt.Errorf("index counts %d queued, want %d", got, n)
		}
		return nil
	})
}

func TestQueueCountsFollowDeletesAndExpiry(t *testing.T) {
	ix, kv := setupIndex(t, 2*time.Second)
	watch(t, ix, kv)
	putQueued(t, kv, "a")
	putQueued(t, kv, "b")
	wantQueued(t, ix, 2, 10*time.Second)
	if err := kv.Delete(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	wantQueued(t, ix, 1, 10*time.Second)
	if !ix.Has("b") || ix.Has("a") {
		t.Errorf("Has(a)=%v Has(b)=%v, want false, true", ix.Has("a"), ix.Has("b"))
	}
	// b expires from the bucket two seconds after it was written, which
	// the watch does not announce: the index must drop it by itself.
	wantQueued(t, ix, 0, 20*time.Second)
}

func TestQueueCountsDropWhatWentWhileUnwatched(t *testing.T) {
	ix, kv := setupIndex(t, time.Hour)
	stop := watch(t, ix, kv)
	putQueued(t, kv, "a")
	putQueued(t, kv, "b")
	wantQueued(t, ix, 2, 10*time.Second)
	stop() // as a NATS outage breaks the watch
	// Gone without a trace, as when the bucket expires it: no delete
	// marker is left for the next watch to replay.
	if err := kv.Purge(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := kv.PurgeDeletes(context.Background(), jetstream.DeleteMarkersOlderThan(-1)); err != nil {
		t.Fatal(err)
	}
	watch(t, ix, kv)
	wantQueued(t, ix, 1, 10*time.Second)
}

// A restart of the server under the watch starts the watch again at the
// reconnect: records put after the restart reach the index without
// waiting for the old watch's consumer to be found dead.
func TestWatchStartsAgainAtAReconnect(t *testing.T) {
	s := natstest.Server(t)
	rc := service.NewReconnects()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nc, _, kv, err := service.Connect(ctx, service.Common{NATSURL: s.URL()}, "gateway", rc, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	core, logs := observer.New(zapcore.InfoLevel)
	ix := New()
	var wg sync.WaitGroup
	wg.Go(func() { ix.Watch(ctx, kv, rc, zap.New(core)) })
	defer func() { cancel(); wg.Wait() }()

	putQueued(t, kv, "a")
	wantQueued(t, ix, 1, 10*time.Second)
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		_, err := kv.Put(ctx, "b", queuedRecord(t, "b"))
		return err
	})
	wantQueued(t, ix, 2, 30*time.Second)
	if logs.FilterMessage("nats reconnected: reading the status bucket again").Len() == 0 {
		t.Errorf("the watch did not start again at the reconnect: %v", logs.All())
	}
}
