package api

import (
	"context"
	"errors"
	"mime"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/services/gateway/jobs"
	"github.com/orch-dev/orch/services/gateway/metrics"
	"github.com/orch-dev/orch/services/gateway/queue"
	"github.com/orch-dev/orch/services/gateway/trigger"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// JobRef names one job in an answer. Duplicate says the job existed
// before this request (the same event or key again): nothing new was
// queued for it.
type JobRef = jobs.Ref

// Accepted is the body of a 202 webhook answer. Spooled says the event is
// kept on the gateway's disk until JetStream is back; the job ids are
// final either way.
type Accepted struct {
	Jobs    []JobRef        `json:"jobs"`
	Cancel  *trigger.Cancel `json:"cancel,omitempty"`
	Spooled bool            `json:"spooled,omitempty"`
}

// Ignored is the body of a webhook orch does not act on.
type Ignored struct {
	Ignored string `json:"ignored"`
}

// webhookSource describes one sender.
type webhookSource struct {
	name        string
	sigHeader   string
	eventHeader string
	delivery    string
	decide      func(ctx context.Context, s *Server, event, delivery string, body []byte) (trigger.Decision, error)
}

var (
	giteaSource = webhookSource{
		name: "gitea", sigHeader: webhook.GiteaSignature,
		eventHeader: webhook.GiteaEventType, delivery: webhook.GiteaDelivery,
		decide: func(_ context.Context, s *Server, event, delivery string, body []byte) (trigger.Decision, error) {
			return trigger.Gitea(s.Registry(), event, delivery, body, s.nowUTC())
		},
	}
	planeSource = webhookSource{
		name: "plane", sigHeader: webhook.PlaneSignature,
		eventHeader: webhook.PlaneEventHeader, delivery: webhook.PlaneDelivery,
		decide: func(ctx context.Context, s *Server, event, delivery string, body []byte) (trigger.Decision, error) {
			// The item's readable name, from Plane's API within a short
			// budget (package planenames); "" keeps its id. The name its
			// jobs already have wins, read from the index: the jobs
			// answered just now are waited for (their records follow
			// the answer).
			s.Queue.SettleAll(ctx)
			reg := s.Registry()
			return trigger.PlaneNamed(reg, event, delivery, body, s.nowUTC(), s.PlaneNames.Name(ctx, reg, event, body))
		},
	}
)

// planeAgentSource is a Plane agent app's deliveries (its runs), signed
// with the app's own webhook secret.
var planeAgentSource = webhookSource{
	name: "plane-agent", sigHeader: webhook.PlaneSignature,
	eventHeader: webhook.PlaneEventHeader, delivery: webhook.PlaneDelivery,
	decide: func(ctx context.Context, s *Server, _, delivery string, body []byte) (trigger.Decision, error) {
		s.Queue.SettleAll(ctx) // as planeSource's
		reg := s.Registry()
		return trigger.PlaneAgent(reg, delivery, body, s.nowUTC(), s.PlaneNames.NameAgent(ctx, reg, body))
	},
}

func (s *Server) planeAgentWebhook(w http.ResponseWriter, r *http.Request) {
	s.webhook(w, r, planeAgentSource, s.PlaneAgentSecret)
}

func (s *Server) giteaWebhook(w http.ResponseWriter, r *http.Request) {
	s.webhook(w, r, giteaSource, s.GiteaSecret)
}

func (s *Server) planeWebhook(w http.ResponseWriter, r *http.Request) {
	s.webhook(w, r, planeSource, s.PlaneSecret)
}

// webhook verifies, decides and carries out one delivery. It answers 202
// only once JetStream or the spool holds the decision: the senders never
// send an event twice.
func (s *Server) webhook(w http.ResponseWriter, r *http.Request, src webhookSource, secret string) {
	event, delivery := r.Header.Get(src.eventHeader), r.Header.Get(src.delivery)
	// The delivery's fields go on each line rather than into a derived
	// logger: most deliveries log nothing but the job lines.
	log := logFrom(r)
	fields := func(more ...zap.Field) []zap.Field {
		return append([]zap.Field{zap.String("source", src.name), zap.String("event", event), zap.String("delivery", delivery)}, more...)
	}
	verified := false
	count := func(outcome string) { s.Metrics.Webhook(src.name, event, verified, outcome) }
	fail := func(code int, outcome, msg string) {
		count(outcome)
		log.Info("webhook refused", fields(zap.Int("status", code), zap.String("reason", msg))...)
		writeError(w, code, msg)
	}

	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			fail(http.StatusUnsupportedMediaType, metrics.OutcomeUnsupported,
				"content type "+ct+" is not supported: set the webhook's content type to application/json")
			return
		}
	}
	if r.ContentLength > s.MaxBodyBytes {
		fail(http.StatusRequestEntityTooLarge, metrics.OutcomeTooLarge, "body larger than ORCH_MAX_BODY_BYTES")
		return
	}
	release, err := s.Webhooks.acquire(r.Context())
	if err != nil {
		if errors.Is(err, errBusy) {
			w.Header().Set("Retry-After", "5")
			fail(http.StatusServiceUnavailable, metrics.OutcomeBusy,
				"too many webhook deliveries at once (ORCH_MAX_CONCURRENT_WEBHOOKS): try again later")
			return
		}
		fail(http.StatusServiceUnavailable, metrics.OutcomeBusy, "gave up waiting for a body slot: "+err.Error())
		return
	}
	defer release()
	s.Metrics.WebhooksInFlight.Inc()
	defer s.Metrics.WebhooksInFlight.Dec()
	buf, err := s.Webhooks.readBody(w, r, s.MaxBodyBytes)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		fail(http.StatusRequestEntityTooLarge, metrics.OutcomeTooLarge, "body larger than ORCH_MAX_BODY_BYTES")
		return
	case timedOut(err):
		fail(http.StatusRequestTimeout, metrics.OutcomeTimeout, "body not received within "+s.Webhooks.BodyTimeout.String())
		return
	case err != nil:
		fail(http.StatusBadRequest, metrics.OutcomeMalformed, "reading body: "+err.Error())
		return
	}
	defer putBody(buf)
	// The decision copies what it keeps: body is not used after the
	// answer, when its buffer goes back to the pool.
	body := buf.Bytes()
	if err := webhook.Verify(secret, body, r.Header.Get(src.sigHeader)); err != nil {
		fail(http.StatusUnauthorized, metrics.OutcomeUnauthorized, err.Error())
		return
	}
	verified = true
	d, err := src.decide(r.Context(), s, event, delivery, body)
	if err != nil {
		fail(http.StatusBadRequest, metrics.OutcomeMalformed, err.Error())
		return
	}
	if d.Ignored != "" {
		count(metrics.OutcomeIgnored)
		log.Info("webhook ignored", fields(zap.String("reason", d.Ignored))...)
		writeJSON(w, http.StatusOK, Ignored{Ignored: d.Ignored})
		return
	}
	applied, err := s.Queue.Apply(r.Context(), src.name, event, d, log)
	if queue.Permanent(err) {
		count(metrics.OutcomeFailed)
		log.Error("event can never be queued", fields(zap.Error(err))...)
		writeError(w, http.StatusInternalServerError, "the event's jobs cannot be queued: "+err.Error())
		return
	}
	if err != nil {
		count(metrics.OutcomeFailed)
		log.Error("event could be neither queued nor spooled", fields(zap.Error(err))...)
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "could not queue the event: JetStream unavailable and the spool failed")
		return
	}
	ans := Accepted{Jobs: make([]JobRef, 0, len(d.Jobs)), Cancel: d.Cancel, Spooled: applied.Spooled}
	for i := range d.Jobs {
		ref := jobs.RefOf(&d.Jobs[i])
		ref.Duplicate = applied.Duplicate[ref.ID]
		ans.Jobs = append(ans.Jobs, ref)
	}
	if applied.Spooled {
		count(metrics.OutcomeSpooled)
	} else {
		count(metrics.OutcomeQueued)
	}
	writeJSON(w, http.StatusAccepted, ans)
}

// nowUTC is the server's clock.
func (s *Server) nowUTC() time.Time {
	if s.Now == nil {
		return time.Now().UTC()
	}
	return s.Now().UTC()
}
