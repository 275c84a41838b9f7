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
	"github.com/orch-dev/orch/services/gateway/index"
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
// A job's key is written once its status record exists (Keep), never at
// intake: the webhook's publish is its only durable write, and until the
// record exists the job is known from JOBS (see Queue.Enqueue); then the
// record dedupes it, for days. A record exists only for a job that was
// published, so a key is never written for a publish that failed.
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

// Published reports whether job id was published (its key is younger
// than the TTL).
func (d *Dedupe) Published(ctx context.Context, id string) (bool, error) {
	d.mu.RLock()
	at, ok := d.keys[keyOf(id)]
	synced := d.synced
	d.mu.RUnlock()
	if ok || synced {
		return ok && time.Since(at) < d.ttl, nil
	}
	_, err := d.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Recorded is where Keep finds the jobs that have a status record: the
// gateway's index.Index.
type Recorded interface {
	// EachRecord calls f for every job with a record.
	EachRecord(f func(index.Ref))
	// RecordsRead reports whether every record was read once.
	RecordsRead() bool
}

// keepTiming returns, for records kept statusTTL, how often Keep walks
// them and how old a record's latest version must be before its key is
// written: a minute and ten minutes for the default week, a tenth and a
// quarter of a short TTL.
func keepTiming(statusTTL time.Duration) (every, after time.Duration) {
	ttl := cmp.Or(statusTTL, proto.StatusTTLDefault)
	return min(time.Minute, ttl/10), min(10*time.Minute, ttl/4)
}

// Keep writes the key of every job whose status record recs holds and
// whose key the copy lacks, until ctx ends: once recs and the copy have
// read their buckets, and again every minute (see keepTiming). A key is
// written only once the record's latest version is ten minutes old, off
// the moments the record is busy: the record dedupes the job meanwhile,
// and the bucket keeps it for statusTTL, a week by default, after that
// version. So a burst of webhooks or of jobs pays for no key, and a
// gateway that was stopped writes the keys it missed when it starts
// again. A key that cannot be written (NATS away) is tried again on the
// next walk.
func (d *Dedupe) Keep(ctx context.Context, recs Recorded, statusTTL time.Duration, log *zap.Logger) {
	every, after := keepTiming(statusTTL)
	tick := time.NewTicker(min(every, 100*time.Millisecond))
	defer tick.Stop()
	for ctx.Err() == nil && !(recs.RecordsRead() && d.isSynced()) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	tick.Reset(every)
	for {
		var failed int
		recs.EachRecord(func(ref index.Ref) {
			if ctx.Err() != nil || time.Since(ref.Written) < after {
				return
			}
			if err := d.keep(ctx, ref); err != nil {
				if failed++; failed == 1 {
					log.Warn("writing dedupe keys, will retry", zap.String("job", ref.ID), zap.Error(err))
				}
			}
		})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// keep writes ref's key unless the copy has it. Another gateway may write
// it first: a key that exists is kept as it is.
func (d *Dedupe) keep(ctx context.Context, ref index.Ref) error {
	k := keyOf(ref.ID)
	d.mu.RLock()
	_, ok := d.keys[k]
	d.mu.RUnlock()
	if ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	if _, err := d.kv.Create(ctx, ref.ID, []byte(ref.Project+"/"+string(ref.Kind)+"/"+ref.Task)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return err
	}
	d.mu.Lock()
	if _, ok := d.keys[k]; !ok {
		d.keys[k] = time.Now()
	}
	d.mu.Unlock()
	return nil
}

// keepTimeout bounds one key's write.
const keepTimeout = 5 * time.Second

func (d *Dedupe) isSynced() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.synced
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
