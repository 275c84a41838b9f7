package proto

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Topology defaults.
const (
	// DuplicateWindowDefault is how long JetStream remembers a Nats-Msg-Id.
	DuplicateWindowDefault = 10 * time.Minute
	// StatusTTLDefault is how long a status record stays in KV jobs, and so
	// how long a repeated event is still recognised as a duplicate.
	StatusTTLDefault = 7 * 24 * time.Hour
	// AdvisoryMaxAgeDefault bounds how long an unhandled advisory is kept.
	AdvisoryMaxAgeDefault = 7 * 24 * time.Hour
	// DLQMaxAgeDefault bounds how long a dead-lettered job is kept.
	DLQMaxAgeDefault = 30 * 24 * time.Hour
	// TaskLocksMaxAge bounds how long a task lock left by a crashed runner
	// stays in BucketTaskLocks. Runners take over a lock that has not been
	// refreshed for AckWait plus the kill grace long before that; this only
	// collects garbage.
	TaskLocksMaxAge = 24 * time.Hour
	// LogMaxAgeDefault is how long an attempt's output stays in StreamLogs.
	LogMaxAgeDefault = 7 * 24 * time.Hour
	// LogMaxBytesDefault bounds StreamLogs; the oldest output goes first.
	LogMaxBytesDefault = 1 << 30
	// LogDuplicateWindow is StreamLogs' dedupe window: long enough for a
	// runner to retry a batch whose ack it lost in a NATS outage.
	LogDuplicateWindow = 2 * time.Minute
)

// BucketTaskLocks is the KV bucket of task locks, keyed by
// <project>.<task>: the runner holding a task's key is the only one
// working in that task's worktree. The value names the holder; runners
// refresh it with every heartbeat and delete it when the job ends.
const BucketTaskLocks = "task_locks"

// StreamTaskLocks is the stream behind BucketTaskLocks. Runners ask it for
// the server's time: a lock is stale by the age of its revision on the
// server's clock, the clock that stamped the revision.
const StreamTaskLocks = "KV_" + BucketTaskLocks

// Topology is the shape of orch's streams and bucket. Every service calls
// Ensure with the same values at start; CreateOrUpdate makes that safe.
type Topology struct {
	// Replicas of every stream and the bucket; 1 on a single server, 3 on
	// a three-node cluster. Zero means 1.
	Replicas int
	// DuplicateWindow of StreamJobs. Zero means DuplicateWindowDefault.
	DuplicateWindow time.Duration
	// StatusTTL of BucketJobs. Zero means StatusTTLDefault.
	StatusTTL time.Duration
	// LogMaxAge and LogMaxBytes bound StreamLogs. Zero means
	// LogMaxAgeDefault and LogMaxBytesDefault.
	LogMaxAge   time.Duration
	LogMaxBytes int64
}

// stream is what every orch stream shares: its name and subjects, file
// storage and the topology's replicas. Each stream's own method adds its
// limits.
func (t Topology) stream(name, description string, retention jetstream.RetentionPolicy, subjects ...string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: description,
		Subjects:    subjects,
		Retention:   retention,
		Storage:     jetstream.FileStorage,
		Replicas:    cmp.Or(t.Replicas, 1),
	}
}

// bucket is what both orch buckets share: one value per key, kept for
// ttl, on file storage with the topology's replicas.
func (t Topology) bucket(name, description string, ttl time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      name,
		Description: description,
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    cmp.Or(t.Replicas, 1),
	}
}

// JobsStream is the configuration of StreamJobs.
func (t Topology) JobsStream() jetstream.StreamConfig {
	c := t.stream(StreamJobs, "orch jobs waiting for or held by a runner", jetstream.WorkQueuePolicy, SubjectJobsAll)
	c.Duplicates = cmp.Or(t.DuplicateWindow, DuplicateWindowDefault)
	c.Discard = jetstream.DiscardOld
	// Direct gets let an operator read queued jobs without a consumer
	// (`nats stream view JOBS`): a WorkQueue stream takes no second
	// consumer that overlaps the runner's.
	c.AllowDirect = true
	return c
}

// AdvisoriesStream is the configuration of StreamAdvisories.
func (t Topology) AdvisoriesStream() jetstream.StreamConfig {
	c := t.stream(StreamAdvisories, "JetStream advisories of jobs that failed for good", jetstream.LimitsPolicy,
		SubjectAdvisoryMaxDeliveries, SubjectAdvisoryTerminated)
	c.MaxAge = AdvisoryMaxAgeDefault
	return c
}

// DLQStream is the configuration of StreamDLQ.
func (t Topology) DLQStream() jetstream.StreamConfig {
	c := t.stream(StreamDLQ, "orch jobs that failed for good, for inspection and re-run", jetstream.LimitsPolicy, SubjectDLQAll)
	c.MaxAge = DLQMaxAgeDefault
	c.Duplicates = cmp.Or(t.DuplicateWindow, DuplicateWindowDefault)
	return c
}

// LogsStream is the configuration of StreamLogs: limits retention, the
// oldest output dropped first when a bound is reached.
func (t Topology) LogsStream() jetstream.StreamConfig {
	c := t.stream(StreamLogs, "orch agents' output, one subject per attempt of a job", jetstream.LimitsPolicy, SubjectLogsAll)
	c.MaxAge = cmp.Or(t.LogMaxAge, LogMaxAgeDefault)
	c.MaxBytes = cmp.Or(t.LogMaxBytes, LogMaxBytesDefault)
	c.Discard = jetstream.DiscardOld
	c.Duplicates = LogDuplicateWindow
	return c
}

// JobsBucket is the configuration of BucketJobs.
func (t Topology) JobsBucket() jetstream.KeyValueConfig {
	return t.bucket(BucketJobs, "orch job status records, keyed by job id", cmp.Or(t.StatusTTL, StatusTTLDefault))
}

// TaskLocksBucket is the configuration of BucketTaskLocks.
func (t Topology) TaskLocksBucket() jetstream.KeyValueConfig {
	return t.bucket(BucketTaskLocks, "orch task locks: one job per task worktree at a time", TaskLocksMaxAge)
}

// Ensure creates or updates StreamJobs, StreamAdvisories, StreamDLQ,
// StreamLogs, BucketJobs, BucketTaskLocks, BucketPauses, BucketSpend and
// ObjectStoreTaskState. It is idempotent and returns the status
// bucket.
func (t Topology) Ensure(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	for _, cfg := range []jetstream.StreamConfig{t.JobsStream(), t.AdvisoriesStream(), t.DLQStream(), t.LogsStream()} {
		_, err := js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			_, err = js.UpdateStream(ctx, cfg)
		}
		if err != nil {
			return nil, fmt.Errorf("ensuring stream %s: %w", cfg.Name, err)
		}
	}
	kv, err := EnsureBucket(ctx, js, t.JobsBucket())
	if err != nil {
		return nil, err
	}
	for _, cfg := range []jetstream.KeyValueConfig{t.TaskLocksBucket(), t.PausesBucket(), t.SpendBucket()} {
		if _, err := EnsureBucket(ctx, js, cfg); err != nil {
			return nil, err
		}
	}
	if _, err := EnsureObjectStore(ctx, js, t.TaskStateStore()); err != nil {
		return nil, err
	}
	return kv, nil
}

// EnsureBucket creates the bucket, or updates it if it exists with
// another configuration. Like the streams in Ensure, a bucket that is
// already as configured is left alone: services start together, and an
// update of a stream while another service creates a consumer (a KV
// watch) on it is a data race inside nats-server (seen under -race).
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.UpdateKeyValue(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("ensuring bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// RunnerConsumer is the configuration of ConsumerRunner. maxConcurrency is
// MaxAckPending: how many jobs are held at once across every runner.
// maxAttempts is MaxDeliver. ackWait is how long a held job may go without
// an ack or InProgress before JetStream hands it to another runner.
func RunnerConsumer(maxConcurrency, maxAttempts int, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerRunner,
		Description:   "orch runners; MaxAckPending is the global agent limit",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: SubjectJobsAll,
		MaxAckPending: maxConcurrency,
		MaxDeliver:    maxAttempts,
		AckWait:       ackWait,
	}
}

// NotifierConsumer is the configuration of ConsumerNotifier.
func NotifierConsumer(maxDeliver int, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerNotifier,
		Description:   "orch notifiers: one alert per terminal failure",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 1,
		MaxDeliver:    maxDeliver,
		AckWait:       ackWait,
	}
}
