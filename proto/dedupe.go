package proto

import (
	"cmp"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Names of the gateway's dedupe memory: which deliveries it has already
// turned into jobs, kept longer than their status records.
const (
	// BucketDedupe is the KV bucket of dedupe keys, keyed by job id (which
	// follows from the event's content, see JobID). A key says the job was
	// published once; its value (the job's project, kind and task) is for
	// a person reading the bucket. Only the gateway reads and writes it.
	BucketDedupe = "dedupe"
	// StreamDedupe is the stream behind BucketDedupe, named in NATS
	// permissions ($JS.API.*.KV_dedupe...).
	StreamDedupe = "KV_" + BucketDedupe
	// SubjectDedupeAll is every subject of BucketDedupe's keys, named in
	// NATS permissions.
	SubjectDedupeAll = "$KV." + BucketDedupe + ".>"
	// DedupeTTLDefault is how long a dedupe key is kept: a delivery
	// replayed within it runs nothing, however long ago its status record
	// expired (StatusTTLDefault is a week).
	DedupeTTLDefault = 30 * 24 * time.Hour
)

// DedupeBucket is the configuration of BucketDedupe, its keys kept for ttl
// (zero means DedupeTTLDefault). It is independent of StatusTTL: the
// record of a job may go long before the memory that it ran.
func (t Topology) DedupeBucket(ttl time.Duration) jetstream.KeyValueConfig {
	return t.bucket(BucketDedupe, "orch gateway dedupe keys: job ids already published", cmp.Or(ttl, DedupeTTLDefault))
}
