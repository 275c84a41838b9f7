// Package statustest lets a test put a job's status record in any shape,
// bypassing the lifecycle's transitions, to stage what a service reads.
package statustest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// Set applies f to the record of job (a queued record of job when there
// is none) and writes it as it is, failing the test on error.
func Set(t testing.TB, s *status.Store, job *proto.Job, f func(*proto.Status)) *proto.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _, err := s.Get(ctx, job.ID)
	if errors.Is(err, status.ErrNotFound) {
		st, err = &proto.Status{Job: *job, State: proto.StateQueued}, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	f(st)
	st.Schema, st.UpdatedAt = proto.SchemaVersion, time.Now().UTC()
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KV.Put(ctx, job.ID, data); err != nil {
		t.Fatal(err)
	}
	return st
}
