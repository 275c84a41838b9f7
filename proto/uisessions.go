package proto

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketUISessions is the KV bucket of the dashboard's logins, shared by
// every gateway replica behind one load balancer: a login link made on one
// logs in on another, and a logout on one ends the session on all. Its keys
// are "link.<hash>" (a single-use login link, spent by a delete that names
// its revision, so two requests racing for it cannot both win) and
// "session.<hash>" (a browser's session, deleted at logout), where <hash>
// is the hex SHA-256 of the secret the link or the cookie carries: a
// reader of the bucket learns no login. Only gateways use it.
const BucketUISessions = "ui_sessions"

// UISessionTTL is how long a dashboard session lasts after login, and so
// the TTL of BucketUISessions. A login link ends sooner, by the expiry it
// records (ten minutes).
const UISessionTTL = 12 * time.Hour

// UISessionsBucket is the configuration of BucketUISessions.
func (t Topology) UISessionsBucket() jetstream.KeyValueConfig {
	return t.bucket(BucketUISessions, "orch dashboard logins: single-use login links and sessions", UISessionTTL)
}
