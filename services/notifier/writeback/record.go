package writeback

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// record is a job's write-back record in proto.BucketWriteback: where its
// tracking comment is, what it shows, and which notifier holds the job.
//
// Every write is a compare-and-set on the record's revision. A notifier
// writes to a tracker only while it holds the lease (Owner, LeaseUntil),
// which it takes and renews with such writes; so of several notifiers
// watching the same jobs one writes a given job at a time, and another
// takes over when the lease runs out (its holder died).
type record struct {
	Owner      string    `json:"owner,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// GiteaComment and PlaneComment are the ids of the tracking comment,
	// once created.
	GiteaComment int64  `json:"gitea_comment,omitempty"`
	PlaneComment string `json:"plane_comment,omitempty"`
	// GiteaHash, PlaneHash and StatusKey say what was last written, so an
	// unchanged view is not written again.
	GiteaHash string `json:"gitea_hash,omitempty"`
	PlaneHash string `json:"plane_hash,omitempty"`
	StatusKey string `json:"status_key,omitempty"`
	// SHA is the pull request's head the commit status is set on.
	SHA string `json:"sha,omitempty"`
	// EditedAt is the last write to the tracker: the next edit waits
	// MinEdit after it.
	EditedAt time.Time `json:"edited_at,omitzero"`
	// Rev is the revision of the job's status record that every target
	// shows in full; nothing is left to do for revisions up to it.
	Rev uint64 `json:"rev,omitempty"`
	// Stopped says why write-back for the job ended for good (404).
	Stopped string `json:"stopped,omitempty"`
	// RunThought, RunFinal: the job's Plane agent run got its first
	// thought, and its response or error. RunAction is the digest of the
	// last tool call posted as an action, at RunActionAt.
	RunThought  bool      `json:"run_thought,omitempty"`
	RunFinal    bool      `json:"run_final,omitempty"`
	RunAction   string    `json:"run_action,omitempty"`
	RunActionAt time.Time `json:"run_action_at,omitzero"`
}

// errLeaseLost is returned when another notifier took the job over.
var errLeaseLost = errors.New("another notifier took the job over")

// records is the write-back bucket.
type records struct{ kv jetstream.KeyValue }

// get returns job id's record and its revision (0: none yet).
func (r records) get(ctx context.Context, id string) (*record, uint64, error) {
	e, err := r.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &record{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading write-back record: %w", err)
	}
	var rec record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("decoding write-back record: %w", err)
	}
	return &rec, e.Revision(), nil
}

// put writes rec if the record is still at rev, and returns its new
// revision; errLeaseLost when another writer got there first.
func (r records) put(ctx context.Context, id string, rec *record, rev uint64) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		rev, err = r.kv.Create(ctx, id, data)
	} else {
		rev, err = r.kv.Update(ctx, id, data, rev)
	}
	if err == nil {
		return rev, nil
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, errLeaseLost
	}
	return 0, fmt.Errorf("writing write-back record: %w", err)
}

// held is a record this notifier holds the lease of.
type held struct {
	records
	id    string
	rec   *record
	rev   uint64
	owner string
	lease time.Duration
}

// save writes the record and renews the lease.
func (h *held) save(ctx context.Context) error {
	h.rec.Owner, h.rec.LeaseUntil = h.owner, time.Now().Add(h.lease)
	rev, err := h.put(ctx, h.id, h.rec, h.rev)
	if err != nil {
		return err
	}
	h.rev = rev
	return nil
}

// hold renews the lease when less than two thirds of it are left, so that
// it outlasts the next request to the tracker.
func (h *held) hold(ctx context.Context) error {
	if time.Until(h.rec.LeaseUntil) > h.lease*2/3 {
		return nil
	}
	return h.save(ctx)
}

// release gives the job up, keeping what was written.
func (h *held) release(ctx context.Context) error {
	h.rec.Owner, h.rec.LeaseUntil = "", time.Time{}
	rev, err := h.put(ctx, h.id, h.rec, h.rev)
	if err == nil {
		h.rev = rev
	}
	return err
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:12])
}
