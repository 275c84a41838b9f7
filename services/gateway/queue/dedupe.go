package queue

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
)

// Dedupe is the gateway's memory of the jobs it has published, kept in
// KV proto.BucketDedupe for the dedupe TTL (30 days by default), longer
// than the status records (a week), so that a signed delivery captured
// and replayed after its record expired runs nothing.
//
// The bucket is read through a copy in memory, kept current by a watch of
// the keys only (no values), so that asking costs no round trip: about 30
// bytes a key, some 10 MiB for 300,000 jobs in 30 days. Until the copy
// has read the bucket (the first seconds after a start) a question is
// answered by the bucket itself.
//
// A key is written right after JetStream acked its job, at the same time
// as the job's status record, never before the publish: a key written
// for a publish that then failed would make every retry of the event a
// "duplicate" that was never queued. Both writes follow the 202 (see
// Queue.record): a gateway that dies between the ack and the key leaves
// a job without a key, and its event, replayed later than JetStream's
// duplicate window while its record is missing, would run again. The
// window is the time of one round trip to the server.
type Dedupe struct {
	kv  jetstream.KeyValue
	ttl time.Duration

	mu     sync.RWMutex
	keys   map[dedupeKey]time.Time // when each job was published
	synced bool
}

// dedupeKey is a job id in 12 bytes: the hex of proto.JobID decoded, or,
// for any other id, the first 12 bytes of its SHA-256.
type dedupeKey [12]byte

func keyOf(id string) dedupeKey {
	var k dedupeKey
	if len(id) == 2*len(k) {
		if _, err := hex.Decode(k[:], []byte(id)); err == nil {
			return k
		}
	}
	sum := sha256.Sum256([]byte(id))
	copy(k[:], sum[:])
	return k
}

// NewDedupe returns the dedupe memory over kv, the ensured BucketDedupe,
// whose keys live ttl.
func NewDedupe(kv jetstream.KeyValue, ttl time.Duration) *Dedupe {
	return &Dedupe{kv: kv, ttl: cmp.Or(ttl, proto.DedupeTTLDefault), keys: map[dedupeKey]time.Time{}}
}

// Published returns when job id was published, and false when it is not
// known (never published, or longer ago than the TTL).
func (d *Dedupe) Published(ctx context.Context, id string) (time.Time, bool, error) {
	d.mu.RLock()
	at, ok := d.keys[keyOf(id)]
	synced := d.synced
	d.mu.RUnlock()
	if ok || synced {
		return at, ok && time.Since(at) < d.ttl, nil
	}
	e, err := d.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return e.Created(), true, nil
}

// Record writes job's key: it was published just now.
func (d *Dedupe) Record(ctx context.Context, job *proto.Job) error {
	if _, err := d.kv.Put(ctx, job.ID, []byte(job.Project+"/"+string(job.Kind)+"/"+job.Task.ID)); err != nil {
		return err
	}
	d.mu.Lock()
	d.keys[keyOf(job.ID)] = time.Now()
	d.mu.Unlock()
	return nil
}

// Watch keeps the copy current until ctx ends, restarting the watch when
// it breaks (a NATS outage, say) and when the connection reconnects (rc
// may be nil): the watch's consumer may have gone with a server.
func (d *Dedupe) Watch(ctx context.Context, rc *service.Reconnects, log *zap.Logger) {
	for ctx.Err() == nil {
		if err := d.watchOnce(ctx, rc.Next()); err != nil && ctx.Err() == nil {
			log.Warn("watching the dedupe bucket, will retry", zap.Error(err))
			backoff.Sleep(ctx, time.Second)
		}
	}
}

// watchOnce reads every key of the bucket and then follows it until the
// watch breaks or ctx ends. Keys the bucket expires leave no trace in the
// watch, so they are swept by their age; a watch started again drops the
// keys that went while nobody watched.
func (d *Dedupe) watchOnce(ctx context.Context, reconnected <-chan struct{}) error {
	w, err := d.kv.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return err
	}
	defer w.Stop()
	sweep := time.NewTicker(min(max(d.ttl/100, time.Second), time.Hour))
	defer sweep.Stop()
	seen := map[dedupeKey]time.Time{} // the initial keys; nil after them
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reconnected:
			return nil
		case <-sweep.C:
			d.expire(time.Now().Add(-d.ttl))
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil { // every key has been delivered
				d.mu.Lock()
				for k, at := range d.keys { // written by Record meanwhile
					if _, ok := seen[k]; !ok && time.Since(at) < time.Minute {
						seen[k] = at
					}
				}
				d.keys, d.synced, seen = seen, true, nil
				d.mu.Unlock()
				continue
			}
			k := keyOf(e.Key())
			if seen != nil {
				if e.Operation() == jetstream.KeyValuePut {
					seen[k] = e.Created()
				} else {
					delete(seen, k)
				}
				continue
			}
			d.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				d.keys[k] = e.Created()
			} else {
				delete(d.keys, k)
			}
			d.mu.Unlock()
		}
	}
}

// expire forgets the keys published before cutoff: the bucket has
// expired them.
func (d *Dedupe) expire(cutoff time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, at := range d.keys {
		if at.Before(cutoff) {
			delete(d.keys, k)
		}
	}
}
