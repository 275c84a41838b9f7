package proto

import (
	"cmp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Names of the tracker write-back: how orch recognises its own tracking
// comment on a Gitea pull request or a Plane work item, and where the
// notifiers keep what they wrote.
const (
	// CommentMarkerPrefix starts the hidden marker that opens the body of
	// every Gitea comment orch writes: "<!-- orch:job:<id> -->". The
	// notifier finds its comment again by it, and the gateway never takes
	// a comment carrying it as a trigger.
	CommentMarkerPrefix = "<!-- orch:job:"
	// PlaneExternalSource is the external_source of every Plane comment
	// orch writes; its external_id is the job id.
	PlaneExternalSource = "orch"
	// BucketWriteback is the KV bucket of write-back records, keyed by job
	// id: which comment holds a job's tracking comment, what it shows, and
	// which notifier is writing it. Only notifiers use it.
	BucketWriteback = "writeback"
	// StatusContextPrefix starts the context of a Gitea commit status:
	// "orch/<kind>".
	StatusContextPrefix = "orch/"
)

// CommentMarker is the hidden marker of job id's Gitea comment.
func CommentMarker(id string) string { return CommentMarkerPrefix + id + " -->" }

// HasCommentMarker reports whether a comment body carries orch's marker,
// which makes it one of orch's own tracking comments.
func HasCommentMarker(body string) bool { return strings.Contains(body, CommentMarkerPrefix) }

// WritebackBucket is the configuration of BucketWriteback. Its records
// live as long as the status records they follow.
func (t Topology) WritebackBucket() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketWriteback,
		Description: "orch tracker write-back: one record per job's tracking comment",
		History:     1,
		TTL:         cmp.Or(t.StatusTTL, StatusTTLDefault) + 24*time.Hour,
		Storage:     jetstream.FileStorage,
		Replicas:    cmp.Or(t.Replicas, 1),
	}
}
