package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// lockServer is a new server's connection and its task-locks bucket.
func lockServer(t testing.TB) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, js, _ := natstest.Connect(t, natstest.Server(t))
	locks, err := js.KeyValue(context.Background(), proto.BucketTaskLocks)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, locks
}

// A refresh whose answer was lost after JetStream stored it leaves the
// lock at a newer revision with the holder's own value: the holder keeps
// the lock (that beat is not confirmed, the next one is). A revision with
// another value is a takeover.
func TestRefreshAfterALostAnswer(t *testing.T) {
	_, _, locks := lockServer(t)
	ctx := context.Background()
	value := []byte(`{"job":"j1","attempt":1,"runner":"r1"}`)
	rev, err := locks.Create(ctx, "widgets.task-l", value)
	if err != nil {
		t.Fatal(err)
	}
	l := &taskLock{kv: locks, key: "widgets.task-l", value: value, rev: rev}

	// The lost answer: the same value stored once more behind the holder's back.
	if _, err := locks.Put(ctx, l.key, value); err != nil {
		t.Fatal(err)
	}
	if err := l.refresh(ctx); err == nil || errors.Is(err, errLockLost) {
		t.Fatalf("refresh after a lost answer: %v, want an unconfirmed beat, not a lost lock", err)
	}
	if err := l.refresh(ctx); err != nil {
		t.Fatalf("next refresh: %v, want the lock kept", err)
	}

	// A takeover: another holder's value.
	if _, err := locks.Put(ctx, l.key, []byte(`{"job":"j1","attempt":2,"runner":"r2"}`)); err != nil {
		t.Fatal(err)
	}
	if err := l.refresh(ctx); !errors.Is(err, errLockLost) {
		t.Fatalf("refresh after a takeover: %v, want errLockLost", err)
	}
	if err := l.release(ctx); err == nil {
		t.Error("a lock taken over was released by its old holder")
	}
}

// A delivery's own lock, left on the server by a create whose answer was
// lost (or taken beside a slot and not given back), is taken at once; a
// lock of another delivery of the same job is waited for.
func TestAcquireLockKnowsItsOwn(t *testing.T) {
	_, js, locks := lockServer(t)
	ctx := context.Background()
	r := &Runner{js: js, locks: locks, log: zap.NewNop(), cfg: Config{Name: "r1", AckWait: time.Hour, KillGrace: time.Second}}
	job := &proto.Job{ID: "j1", Project: "widgets", Task: proto.Task{ID: "task-own"}}
	l, err := r.taskLockOf(job, 1)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := locks.Create(ctx, l.key, l.value)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.acquireLock(wctx, r.log, l); err != nil {
		t.Fatalf("acquiring the delivery's own lock: %v", err)
	}
	if l.rev != rev {
		t.Fatalf("lock at revision %d, want the stored %d", l.rev, rev)
	}

	// The next attempt of the same job is another holder: it waits (the
	// lock is an hour from stale).
	next, err := r.taskLockOf(job, 2)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := r.acquireLock(wctx, r.log, next); err == nil {
		t.Fatal("a second attempt took a lock its first still holds")
	}
}

// A released key is taken again at its delete marker's revision; a
// revision read before another took the key takes nothing, and says the
// key is held; none read is a create.
func TestTakeFreed(t *testing.T) {
	_, _, locks := lockServer(t)
	ctx := context.Background()
	mine := &taskLock{kv: locks, key: "p.task", value: []byte(`{"job":"mine"}`)}
	if err := mine.takeFreed(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := locks.Delete(ctx, mine.key); err != nil {
		t.Fatal(err)
	}
	h, err := locks.History(ctx, mine.key)
	if err != nil {
		t.Fatal(err)
	}
	marker := h[len(h)-1].Revision()
	if err := mine.takeFreed(ctx, marker); err != nil || mine.rev != marker+1 {
		t.Fatalf("taken at the marker %d: rev %d, %v; want %d", marker, mine.rev, err, marker+1)
	}
	if err := locks.Delete(ctx, mine.key); err != nil {
		t.Fatal(err)
	}
	other := &taskLock{kv: locks, key: mine.key, value: []byte(`{"job":"other"}`)}
	if err := other.take(ctx); err != nil {
		t.Fatal(err)
	}
	late := &taskLock{kv: locks, key: mine.key, value: []byte(`{"job":"late"}`)}
	if err := late.takeFreed(ctx, marker); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("taken at an old marker while another holds it: %v", err)
	}
	if e, err := locks.Get(ctx, mine.key); err != nil || string(e.Value()) != `{"job":"other"}` {
		t.Fatalf("the holder's key: %v, %v", e, err)
	}
}
