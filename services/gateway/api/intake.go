package api

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"sync"
	"time"
)

// Defaults of WebhookLimits.
const (
	// MaxConcurrentWebhooksDefault is how many webhook bodies are held at
	// once (ORCH_MAX_CONCURRENT_WEBHOOKS).
	MaxConcurrentWebhooksDefault = 64
	// BodyTimeoutDefault is how long a webhook's body may take to arrive,
	// from the moment it has a slot.
	BodyTimeoutDefault = 10 * time.Second
	// SlotWaitDefault is how long a webhook waits for a free slot before
	// it is answered 503 with Retry-After.
	SlotWaitDefault = 2 * time.Second
)

// WebhookLimits bound what webhook deliveries may hold of the gateway.
// Anyone who can reach the gateway may open connections that announce a
// 5 MiB body and send it a byte at a time, so:
//
//   - a body's buffer grows as its bytes arrive, never from the
//     Content-Length the sender announces;
//   - at most MaxConcurrent deliveries hold a slot, from the first byte
//     read until the answer (as long as their buffer lives), which bounds
//     the memory of bodies to MaxConcurrent times ORCH_MAX_BODY_BYTES;
//   - a body must have arrived BodyTimeout after its slot was taken, or
//     the delivery is answered 408 and its slot freed.
//
// A delivery that finds every slot taken waits up to SlotWait, then is
// answered 503 with Retry-After. Waiting longer would not help the
// senders: Gitea waits 5 s for an answer, which the publish (up to 2 s)
// must fit in as well, and never retries on its own (a person can
// redeliver a failed delivery from the webhook's page, and the 503 shows
// there); Plane counts any answer, a 503 too, as delivered, and a lost
// event is at least counted (outcome busy) and logged.
type WebhookLimits struct {
	// MaxConcurrent is the number of slots; zero means
	// MaxConcurrentWebhooksDefault.
	MaxConcurrent int
	// BodyTimeout: zero means BodyTimeoutDefault.
	BodyTimeout time.Duration
	// SlotWait: zero means SlotWaitDefault.
	SlotWait time.Duration

	once  sync.Once
	slots chan struct{}
}

func (l *WebhookLimits) init() {
	l.once.Do(func() {
		if l.MaxConcurrent <= 0 {
			l.MaxConcurrent = MaxConcurrentWebhooksDefault
		}
		if l.BodyTimeout <= 0 {
			l.BodyTimeout = BodyTimeoutDefault
		}
		if l.SlotWait <= 0 {
			l.SlotWait = SlotWaitDefault
		}
		l.slots = make(chan struct{}, l.MaxConcurrent)
	})
}

// errBusy says every slot stayed taken for SlotWait.
var errBusy = errors.New("too many webhook deliveries at once")

// acquire takes a slot, waiting up to SlotWait, and returns its release.
func (l *WebhookLimits) acquire(ctx context.Context) (release func(), err error) {
	l.init()
	release = func() { <-l.slots }
	select {
	case l.slots <- struct{}{}:
		return release, nil
	default:
	}
	t := time.NewTimer(l.SlotWait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, errBusy
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// readBody reads r's body, at most limit bytes, into a pooled buffer
// that grows as the bytes arrive, within BodyTimeout. The buffer goes
// back with putBody.
func (l *WebhookLimits) readBody(w http.ResponseWriter, r *http.Request, limit int64) (*bytes.Buffer, error) {
	l.init()
	// The server's ReadTimeout bounds the whole request; this shortens it
	// for the body, from the moment it has a slot. A writer that cannot
	// (none of the gateway's) leaves the server's bound.
	err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(l.BodyTimeout))
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		return nil, err
	}
	buf := getBody()
	_, err = buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		putBody(buf)
		return nil, err
	}
	return buf, nil
}

// timedOut reports a body read that hit its deadline.
func timedOut(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// bodies holds webhook body buffers for reuse: a Gitea body is about
// 12 KB, which reading into a fresh slice would grow through several
// copies on every delivery.
var bodies sync.Pool

// maxPooledBody bounds the buffers kept in bodies, so one big delivery
// does not pin its memory.
const maxPooledBody = 64 << 10

// getBody returns an empty buffer. It is never sized from the request's
// Content-Length: that is the sender's word, and a sender that announces
// 5 MiB and sends one byte must cost one byte.
func getBody() *bytes.Buffer {
	buf, _ := bodies.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	return buf
}

func putBody(buf *bytes.Buffer) {
	if buf.Cap() > maxPooledBody {
		return
	}
	buf.Reset()
	bodies.Put(buf)
}
