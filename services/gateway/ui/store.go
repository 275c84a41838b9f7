package ui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/proto"
)

// The dashboard's logins live in the KV bucket proto.BucketUISessions, not
// in the gateway, so that every replica behind a load balancer sees the
// same ones. What must hold:
//
//   - A login link logs in once. Spending it is a delete that names the
//     revision it read (compare and set): of two requests racing for one
//     link, one deletes it and the other's delete fails, and only the one
//     whose delete succeeded starts a session.
//   - A link is good for LinkTTL from when it was made, by the time it
//     records, checked against the gateway's clock; the bucket's TTL (the
//     session's lifetime) collects it later.
//   - A session is the record behind the cookie: logout deletes it, so a
//     copied cookie stops working everywhere at once.
//   - The bucket holds the SHA-256 of each secret, never the secret: a
//     reader of the bucket (an operator with the nats CLI) cannot log in.
//
// Without the bucket (NATS away, or not yet reached) nobody can log in or
// use a session, and the pages say so (503); the bearer-token API does not
// need it.

// LinkTTL is how long a login link may be used after it is made.
const LinkTTL = 10 * time.Minute

// storeTimeout bounds one request to the bucket: a page waits no longer
// than this for NATS before it answers 503.
const storeTimeout = 3 * time.Second

// secretBytes is the size of a link's or a session's random secret.
const secretBytes = 32

// Kinds of record, the first part of their keys.
const (
	kindLink    = "link"
	kindSession = "session"
)

var (
	// errUnavailable: the bucket cannot be reached; try again later.
	errUnavailable = errors.New("the login store (NATS KV bucket " + proto.BucketUISessions + ") is not reachable")
	// errUnknown: no such login (never made, spent, ended or expired).
	errUnknown = errors.New("unknown, spent or expired")
)

// record is a login link's or a session's value in the bucket.
type record struct {
	ExpiresAt time.Time `json:"expires_at"`
}

// store is the bucket of logins, once NATS has been reached.
type store struct {
	kv atomic.Pointer[jetstream.KeyValue]
}

// connect gives the store its bucket.
func (s *store) connect(kv jetstream.KeyValue) { s.kv.Store(&kv) }

// connectWait is how long a login waits for the store while the gateway
// has not reached it yet: that happens just after /readyz says ready
// (the index does not wait for the bucket), so a login made at once
// would otherwise be answered 503.
const connectWait = 3 * time.Second

// bucket returns the bucket and a context bounded by storeTimeout,
// waiting up to connectWait for a store not reached yet.
func (s *store) bucket(ctx context.Context) (jetstream.KeyValue, context.Context, context.CancelFunc, error) {
	p := s.kv.Load()
	if p == nil {
		wait, cancel := context.WithTimeout(ctx, connectWait)
		for p == nil && backoff.Sleep(wait, 10*time.Millisecond) {
			p = s.kv.Load()
		}
		cancel()
	}
	if p == nil {
		return nil, nil, nil, fmt.Errorf("%w: not connected to NATS yet", errUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	return *p, ctx, cancel, nil
}

// newSecret returns a random secret, URL-safe: 256 bits from crypto/rand.
func newSecret() string {
	b := make([]byte, secretBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand.Read's contract)
	return base64.RawURLEncoding.EncodeToString(b)
}

// keyOf is the key of a record of kind for secret.
func keyOf(kind, secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return kind + "." + hex.EncodeToString(sum[:])
}

// create makes a record of kind that expires at exp and returns its secret.
func (s *store) create(ctx context.Context, kind string, exp time.Time) (string, error) {
	kv, ctx, cancel, err := s.bucket(ctx)
	if err != nil {
		return "", err
	}
	defer cancel()
	secret := newSecret()
	data, _ := json.Marshal(record{ExpiresAt: exp.UTC()})
	if _, err := kv.Create(ctx, keyOf(kind, secret), data); err != nil {
		return "", fmt.Errorf("%w: %v", errUnavailable, err)
	}
	return secret, nil
}

// get reads the record of kind for secret, errUnknown unless it is there
// and has not expired at now.
func (s *store) get(ctx context.Context, kind, secret string, now time.Time) (jetstream.KeyValue, uint64, error) {
	if len(secret) != base64.RawURLEncoding.EncodedLen(secretBytes) {
		return nil, 0, errUnknown // not one of ours: no need to ask
	}
	kv, ctx, cancel, err := s.bucket(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer cancel()
	e, err := kv.Get(ctx, keyOf(kind, secret))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, errUnknown
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	var rec record
	if err := json.Unmarshal(e.Value(), &rec); err != nil || !now.Before(rec.ExpiresAt) {
		return nil, 0, errUnknown
	}
	return kv, e.Revision(), nil
}

// newLink makes a login link good until now+LinkTTL and returns its secret.
func (s *store) newLink(ctx context.Context, now time.Time) (string, error) {
	return s.create(ctx, kindLink, now.Add(LinkTTL))
}

// spendLink uses up the login link of secret: nil for exactly one caller
// while the link is good, errUnknown for every other.
func (s *store) spendLink(ctx context.Context, secret string, now time.Time) error {
	kv, rev, err := s.get(ctx, kindLink, secret, now)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	err = kv.Delete(ctx, keyOf(kindLink, secret), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return errUnknown // another request spent it first
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUnavailable, err)
	}
	return nil
}

// newSession starts a session good until now+SessionTTL and returns the
// secret its cookie carries.
func (s *store) newSession(ctx context.Context, now time.Time) (string, error) {
	return s.create(ctx, kindSession, now.Add(SessionTTL))
}

// session checks the session of secret: nil while it is good.
func (s *store) session(ctx context.Context, secret string, now time.Time) error {
	_, _, err := s.get(ctx, kindSession, secret, now)
	return err
}

// endSession deletes the session of secret, on every replica at once.
func (s *store) endSession(ctx context.Context, secret string) error {
	kv, ctx, cancel, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if err := kv.Delete(ctx, keyOf(kindSession, secret)); err != nil {
		return fmt.Errorf("%w: %v", errUnavailable, err)
	}
	return nil
}
