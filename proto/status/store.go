// Package status reads and writes job status records in the KV bucket
// proto.BucketJobs. Every write is a compare-and-set on the record's
// revision, so a late writer (a runner that stalled past AckWait, say)
// cannot overwrite a newer state it has not seen.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
)

// ErrNotFound is returned for a job id with no status record.
var ErrNotFound = errors.New("no such job")

// Store is the status bucket.
type Store struct {
	KV jetstream.KeyValue
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// New returns a Store over kv.
func New(kv jetstream.KeyValue) *Store { return &Store{KV: kv} }

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Get returns the record of job id and its revision.
func (s *Store) Get(ctx context.Context, id string) (*proto.Status, uint64, error) {
	e, err := s.KV.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading status of %s: %w", id, err)
	}
	st, err := proto.DecodeStatus(e.Value())
	if err != nil {
		return nil, 0, fmt.Errorf("status of %s: %w", id, err)
	}
	return st, e.Revision(), nil
}

// Create writes st if job st.Job.ID has no record yet, and reports whether
// it did. This is the dedupe backstop that outlives JetStream's duplicate
// window.
func (s *Store) Create(ctx context.Context, st *proto.Status) (bool, error) {
	st.Schema = proto.SchemaVersion
	st.UpdatedAt = s.now()
	data, err := json.Marshal(st)
	if err != nil {
		return false, err
	}
	_, err = s.KV.Create(ctx, st.Job.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("creating status of %s: %w", st.Job.ID, err)
	}
	return true, nil
}

// Update applies f to the record of job and writes it back, retrying when
// another writer got there first. A missing record starts as a queued
// record of job. f returns false to leave the record as it is; Update then
// returns the record unchanged.
func (s *Store) Update(ctx context.Context, job *proto.Job, f func(*proto.Status) bool) (*proto.Status, error) {
	for range 20 {
		st, rev, err := s.Get(ctx, job.ID)
		if errors.Is(err, ErrNotFound) {
			st = &proto.Status{Job: *job, State: proto.StateQueued}
		} else if err != nil {
			return nil, err
		}
		if !f(st) {
			return st, nil
		}
		st.Schema = proto.SchemaVersion
		st.UpdatedAt = s.now()
		data, err := json.Marshal(st)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = s.KV.Create(ctx, job.ID, data)
		} else {
			_, err = s.KV.Update(ctx, job.ID, data, rev)
		}
		if err == nil {
			return st, nil
		}
		if !isConflict(err) {
			return nil, fmt.Errorf("writing status of %s: %w", job.ID, err)
		}
	}
	return nil, fmt.Errorf("writing status of %s: too many concurrent writers", job.ID)
}

// isConflict reports a compare-and-set that lost to another writer.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// ErrTerminal is returned by Cancel for a job that has already ended.
var ErrTerminal = errors.New("job has already ended")

// Cancel marks job id cancelled, unless it has ended. This is the whole
// cancel protocol: a runner skips a job whose record says cancelled when it
// pulls it, and a runner running it watches its record and stops the agent
// when it turns cancelled, then terminates the message with reason
// proto.ReasonCancelled (so the notifier stays quiet).
func (s *Store) Cancel(ctx context.Context, id string) (*proto.Status, error) {
	cur, _, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	var ended bool
	st, err := s.Update(ctx, &cur.Job, func(st *proto.Status) bool {
		if ended = st.State.Terminal(); ended {
			return false
		}
		st.State, st.Error = proto.StateCancelled, "cancelled"
		return true
	})
	if err != nil {
		return nil, err
	}
	if ended {
		return st, ErrTerminal
	}
	return st, nil
}
