// Package status reads and writes job status records in the KV bucket
// proto.BucketJobs. Every write is one of the named transitions of
// lifecycle.go, applied as a compare-and-set on the record's revision, so
// a late writer (a runner that stalled past AckWait, say) cannot
// overwrite a newer state it has not seen.
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

// Apply makes transition t on the record of job and writes it back,
// retrying when another writer got there first; the guard is checked
// against each version read. It returns the record as written, or, when
// the guard refuses, the record as it is and the refusal (ErrTerminal,
// ErrSuperseded, ...). A job with no record is presented to t as absent.
func (s *Store) Apply(ctx context.Context, job *proto.Job, t Transition) (*proto.Status, error) {
	if t.absentOnly {
		// Such a record is nearly always new: create it without reading
		// first (one round trip instead of two), and read only when one
		// is there already.
		st := &proto.Status{Job: *job, State: absent}
		if err := t.apply(st); err != nil {
			return st, fmt.Errorf("%s %s: %w", t.Name, job.ID, err)
		}
		if written, err := s.put(ctx, job.ID, t, st, 0); err != nil {
			return nil, err
		} else if written {
			return st, nil
		}
	}
	return s.ApplyFrom(ctx, job, nil, 0, t)
}

// ApplyFrom is Apply starting from cur, the record at revision rev that
// the caller read before (revision 0: the job had no record, cur is the
// job with no state): when nobody wrote it since, the transition costs
// one write and no read; when somebody did, the compare-and-set fails and
// the record is read again, as Apply would; a refusal is only ever
// returned for a record read from the bucket. A nil cur reads it first.
// ApplyFrom may change cur.
func (s *Store) ApplyFrom(ctx context.Context, job *proto.Job, cur *proto.Status, rev uint64, t Transition) (*proto.Status, error) {
	for range 20 {
		st, given := cur, cur != nil
		cur = nil
		var err error
		if !given {
			st, rev, err = s.Get(ctx, job.ID)
		}
		if errors.Is(err, ErrNotFound) {
			st = &proto.Status{Job: *job, State: absent}
		} else if err != nil {
			return nil, err
		}
		if err := t.apply(st); err != nil {
			if given {
				continue // refused by what may be an old version: ask the bucket
			}
			return st, fmt.Errorf("%s %s: %w", t.Name, job.ID, err)
		}
		if written, err := s.put(ctx, job.ID, t, st, rev); err != nil {
			return nil, err
		} else if written {
			return st, nil
		}
	}
	return nil, fmt.Errorf("writing status of %s (%s): too many concurrent writers", job.ID, t.Name)
}

// put writes st, which transition t made of the record at revision rev
// (0: no record), back with a compare-and-set. It reports written false
// and no error when another writer got there first: the caller reads the
// record again.
func (s *Store) put(ctx context.Context, id string, t Transition, st *proto.Status, rev uint64) (written bool, err error) {
	st.Schema = proto.SchemaVersion
	st.UpdatedAt = s.now()
	data, err := json.Marshal(st)
	if err != nil {
		return false, err
	}
	if rev == 0 {
		_, err = s.KV.Create(ctx, id, data)
	} else {
		_, err = s.KV.Update(ctx, id, data, rev)
	}
	switch {
	case err == nil:
		return true, nil
	case isConflict(err):
		return false, nil
	default:
		return false, fmt.Errorf("writing status of %s (%s): %w", id, t.Name, err)
	}
}

// isConflict reports a compare-and-set that lost to another writer.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Cancel applies the Cancel transition to job id, which it looks up: a
// job with no record is ErrNotFound, an ended one ErrTerminal. This is the
// whole cancel protocol: a runner skips a job whose record says cancelled
// when it pulls it, and a runner running it watches its record and stops
// the agent when it turns cancelled, then terminates the message with
// reason proto.ReasonCancelled (so the notifier stays quiet).
func (s *Store) Cancel(ctx context.Context, id string) (*proto.Status, error) {
	cur, _, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.Apply(ctx, &cur.Job, Cancel())
}
