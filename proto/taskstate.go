package proto

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ObjectStoreTaskState is the JetStream object store of task states, one
// object per task keyed by TaskStateKey: what exists only on the disk of
// the runner that last ran the task (its unpushed commits, uncommitted
// changes, the agent's session), so that whichever runner takes the
// task's next job or retry carries on from there. Runners write an object
// when an attempt ends and while the agent runs; a cleanup deletes it.
const ObjectStoreTaskState = "task_state"

// StreamTaskState is the stream behind ObjectStoreTaskState.
const StreamTaskState = "OBJ_" + ObjectStoreTaskState

// TaskStateKey is the name of a task's object in ObjectStoreTaskState:
// <project>.<task>, as the task's lock is keyed.
func TaskStateKey(project, task string) string {
	return Token(project) + "." + Token(task)
}

// TaskStateStore is the configuration of ObjectStoreTaskState: file
// storage with the topology's replicas, no TTL (a task's state lives until
// its cleanup).
func (t Topology) TaskStateStore() jetstream.ObjectStoreConfig {
	return jetstream.ObjectStoreConfig{
		Bucket:      ObjectStoreTaskState,
		Description: "orch task states: a task's unpushed work and agent session, for the next runner",
		Storage:     jetstream.FileStorage,
		Replicas:    cmp.Or(t.Replicas, 1),
	}
}

// EnsureObjectStore creates the object store, or updates it if it exists
// with another configuration, as EnsureBucket does a bucket.
func EnsureObjectStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	obj, err := js.CreateObjectStore(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		obj, err = js.UpdateObjectStore(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("ensuring object store %s: %w", cfg.Bucket, err)
	}
	return obj, nil
}
