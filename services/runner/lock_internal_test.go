package runner

import (
	"context"
	"errors"
	"testing"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// A refresh whose answer was lost after JetStream stored it leaves the
// lock at a newer revision with the holder's own value: the holder keeps
// the lock (that beat is not confirmed, the next one is). A revision with
// another value is a takeover.
func TestRefreshAfterALostAnswer(t *testing.T) {
	_, js, _ := natstest.Connect(t, natstest.Server(t))
	ctx := context.Background()
	locks, err := js.KeyValue(ctx, proto.BucketTaskLocks)
	if err != nil {
		t.Fatal(err)
	}
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
