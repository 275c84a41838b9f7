// Package notifier tells people how jobs went, in two parts. It turns
// JetStream's terminal-failure advisories for JOBS into one Telegram alert
// each, and moves the failed job to JOBS_DLQ (notifier.go and process.go).
// And it writes back to the tracker a job came from (writeback.go, package
// writeback): one tracking comment per job on the Gitea pull request or
// Plane work item, edited in place as the job runs, and a Gitea commit
// status, from a watch of the status bucket (KV jobs).
//
// # Alerts
//
// Advisories arrive only through the stream JOBS_ADVISORIES and its
// durable consumer "notifier", so none is lost while no notifier runs. The
// consumer has MaxAckPending 1: however many replicas run, one advisory is
// handled at a time, which keeps alerts in order and within Telegram's pace
// per chat. Each advisory is handled in steps that are safe to repeat:
//
//  1. find the job: in JOBS by stream sequence (MAX_DELIVERIES), or by the
//     job id in the Term reason in KV jobs (MSG_TERMINATED);
//  2. copy it to JOBS_DLQ and record it failed, unless its status record
//     already names its DLQ sequence;
//  3. send the alert, unless the record's Alerted marker says a person was
//     told already; once Telegram accepted it, set the marker (CAS);
//  4. delete it from JOBS; then ack the advisory.
//
// A crash anywhere repeats at most the step it interrupted, and the marker
// is checked before sending, so a failure is alerted once. The one window
// left is a crash after Telegram accepted a message and before the marker
// is written: the Bot API has no idempotency key, so that alert would be
// sent again. A shutdown never opens that window: once a request has gone
// out, the notifier finishes it and writes the marker before it stops.
package notifier

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

const (
	// ackWait is how long a notifier may hold an advisory without a
	// heartbeat before JetStream gives it to another replica. Handling
	// sends InProgress every ackWait/3.
	ackWait = 30 * time.Second
	// opTimeout bounds each step against NATS or Telegram.
	opTimeout = 30 * time.Second
	// pullWait is how long one pull waits for an advisory.
	pullWait = 5 * time.Second
)

// Config is the notifier's configuration, read from ORCH_ variables; the
// envDefault tags are the defaults.
type Config struct {
	service.Common
	// TelegramBotToken and TelegramChatID say where alerts go; without a
	// token, alerts are only logged (the DLQ is still filled).
	TelegramBotToken string `env:"TELEGRAM_BOT_TOKEN"`
	TelegramChatID   string `env:"TELEGRAM_CHAT_ID"`
	// TelegramThreadID is the forum topic of the chat, if any.
	TelegramThreadID int `env:"TELEGRAM_THREAD_ID"`
	// TelegramAPIURL is the Bot API base.
	TelegramAPIURL string `env:"TELEGRAM_API_URL" envDefault:"https://api.telegram.org"`
	// TelegramRate is the most messages a second sent to the chat, across
	// every replica; it must be above 0. Telegram asks for about 1 a
	// second, and at most 20 a minute in groups (0.33).
	TelegramRate float64 `env:"TELEGRAM_RATE" envDefault:"1"`
	// PublicURL is the gateway's base URL, for a link to the job.
	PublicURL string `env:"PUBLIC_URL"`
	// RetryDelay is the first wait before an advisory is tried again
	// after Telegram or NATS failed without saying how long to wait; it
	// doubles with every failed try, up to RetryMaxDelay. 0 tries again
	// at once.
	RetryDelay time.Duration `env:"NOTIFY_RETRY_DELAY" envDefault:"10s"`
	// RetryMaxDelay caps the doubling wait.
	RetryMaxDelay time.Duration `env:"NOTIFY_RETRY_MAX_DELAY" envDefault:"5m"`
	// RejectedDelay is the wait after Telegram rejected a message (bad
	// token or chat, bot removed): long, since only an operator can fix
	// it, and the advisory is kept until then.
	RejectedDelay time.Duration `env:"NOTIFY_REJECTED_DELAY" envDefault:"5m"`
	// HTTPAddr is where /healthz, /readyz and /metrics are served. A
	// Config built in Go with it empty serves nothing, so that several
	// notifiers can share a process.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8082" default:"env-only"`
	// Listener, when set, is served instead of HTTPAddr (tests).
	Listener net.Listener `env:"-"`
	Writeback
}

// SetDefaults gives a Config built in Go its defaults (see
// service.SetDefaults).
func (c *Config) SetDefaults() { service.SetDefaults(c) }

// Validate reports a configuration the notifier cannot run with.
func (c *Config) Validate() error {
	switch {
	case c.TelegramBotToken != "" && c.TelegramChatID == "":
		return errors.New("ORCH_TELEGRAM_CHAT_ID is required with ORCH_TELEGRAM_BOT_TOKEN")
	case c.TelegramRate <= 0:
		return fmt.Errorf("ORCH_TELEGRAM_RATE must be above 0, got %v", c.TelegramRate)
	case c.TelegramBotToken != "" && c.TelegramAPIURL == "":
		return errors.New("ORCH_TELEGRAM_API_URL must not be empty with ORCH_TELEGRAM_BOT_TOKEN")
	case c.RetryDelay < 0 || c.RetryMaxDelay < 0 || c.RejectedDelay < 0:
		return errors.New("ORCH_NOTIFY_*_DELAY must not be negative")
	}
	return c.Writeback.validate()
}

// Notifier handles advisories.
type Notifier struct {
	cfg     Config
	hooks   hooks
	ackWait time.Duration
	log     *zap.Logger
	js      jetstream.JetStream
	status  *status.Store
	tg      *telegram.Client // nil: log only
	metrics *metrics
}

// hooks let tests watch a running notifier; Run sets none. A hook only
// observes: what the notifier does next does not depend on it.
type hooks struct {
	// started is called once the notifier consumes advisories.
	started func(*Notifier)
	// ackWait replaces the consumer's AckWait.
	ackWait time.Duration
	// alerted is called once an alert's marker is written, before the
	// job leaves JOBS and the advisory is acked: a test kills the
	// notifier there to show that the marker keeps the alert from being
	// sent again.
	alerted func(*Notifier)
	// sweepEvery replaces sweepEvery; swept, if set, is told what each
	// sweep found.
	sweepEvery time.Duration
	swept      func(found int)
}

// Run handles advisories until ctx is cancelled.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	return run(ctx, cfg, log, hooks{})
}

func run(ctx context.Context, cfg Config, log *zap.Logger, h hooks) error {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	m := newMetrics()
	httpSrv, err := service.ServeHTTP(cfg.HTTPAddr, cfg.Listener, m.reg, m.ready, log.Named("http"))
	if err != nil {
		return err
	}
	defer httpSrv.Stop()
	m.addr = httpSrv.Addr()

	nc, js, kv, err := service.Connect(ctx, cfg.Common, "notifier", nil, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	m.connected(nc, js)
	n := &Notifier{cfg: cfg, hooks: h, ackWait: cmp.Or(h.ackWait, ackWait), log: log, js: js, status: status.New(kv), metrics: m}
	if cfg.TelegramBotToken != "" {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		n.tg = &telegram.Client{
			BaseURL: cfg.TelegramAPIURL, Token: cfg.TelegramBotToken,
			ChatID: cfg.TelegramChatID, ThreadID: cfg.TelegramThreadID, Rate: cfg.TelegramRate,
			HTTP: &http.Client{Transport: tr, Timeout: telegram.TimeoutDefault},
		}
	} else {
		log.Warn("no ORCH_TELEGRAM_BOT_TOKEN: alerts are only logged")
	}
	var cons jetstream.Consumer
	if err := service.Retry(ctx, log, "ensuring consumer "+proto.ConsumerNotifier, func(ctx context.Context) (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, proto.StreamAdvisories, proto.NotifierConsumer(-1, n.ackWait))
		return err
	}); err != nil {
		return err
	}
	m.bound.Store(true)
	defer m.bound.Store(false)

	log.Info("notifier started", zap.Bool("telegram", n.tg != nil), zap.Float64("rate", cfg.TelegramRate))
	if h.started != nil {
		h.started(n)
	}
	var wg sync.WaitGroup
	if err := n.startWriteback(ctx, &wg, js, kv, log); err != nil {
		return err
	}
	wg.Go(func() { n.notices(ctx, js, kv) })
	wg.Go(func() { n.sweep(ctx, cmp.Or(h.sweepEvery, sweepEvery), h.swept) })
	n.loop(ctx, cons)
	wg.Wait()
	log.Info("notifier stopped")
	return nil
}

// loop pulls one advisory at a time until ctx ends. Pulling one at a time
// (rather than a prefetching Consume) leaves nothing unhandled in a buffer
// at shutdown for AckWait to bring back.
func (n *Notifier) loop(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, pullWait)
		msg, err := cons.Next(jetstream.FetchContext(fctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				n.log.Debug("pulling advisory", zap.Error(err))
				sleep(ctx, time.Second)
			}
			continue
		}
		n.handle(ctx, msg)
	}
}

// handle acts on one advisory and settles it: acked once the failure is
// dead-lettered and alerted, NAKed with a delay when Telegram or NATS
// failed, so nothing is dropped.
func (n *Notifier) handle(ctx context.Context, msg jetstream.Msg) {
	adv, err := proto.DecodeAdvisory(msg.Data())
	if err != nil {
		n.log.Error("dropping unusable advisory", zap.String("subject", msg.Subject()), zap.Error(err))
		n.metrics.advisories.WithLabelValues("unusable").Inc()
		_ = msg.Term()
		return
	}
	log := n.log.With(zap.String("advisory", adv.ID), zap.Uint64("stream_seq", adv.StreamSeq))
	stop := heartbeat(msg, n.ackWait/3)
	defer stop()

	res := n.process(ctx, log, adv)
	if res.job != "" {
		log = log.With(zap.String("job", res.job))
	}
	switch {
	case res.err != nil && ctx.Err() != nil:
		// Shutting down before anything was sent: hand it back at once
		// to another replica or the next start.
		log.Info("advisory handed back at shutdown", zap.Error(res.err))
		_ = msg.Nak()
	case res.err != nil:
		delay := res.retryIn
		if delay <= 0 {
			delay = n.backoff(msg)
		}
		log.Warn("advisory will be retried", zap.Duration("delay", delay), zap.Error(res.err))
		_ = msg.NakWithDelay(delay)
	default:
		if !res.sentAt.IsZero() && n.tg != nil {
			// Hold the advisory until the chat's pace allows the next
			// message: with MaxAckPending 1 no replica gets the next
			// advisory before the ack, so this keeps the pace across
			// replicas too.
			sleep(ctx, time.Until(res.sentAt.Add(n.tg.Interval())))
		}
		// Confirmed, so a lost ack shows in the log; a lost ack only
		// brings the advisory back to be found done.
		if err := ackConfirmed(ctx, msg, n.ackWait/2); err != nil {
			log.Warn("acking advisory (it will come back and be found done)", zap.Error(err))
		}
		n.metrics.advisories.WithLabelValues(res.outcome).Inc()
	}
}

// ackConfirmed acks msg and waits for JetStream's confirmation, trying
// again for up to budget. An ack sent while the consumer's leader is lost
// (a cluster member down, a new leader not yet elected) is never answered,
// and an advisory left unacked holds back every later one (MaxAckPending
// 1) until ackWait brings it back: 30 s without alerts for every such
// election (make soak-cluster). Acking again is harmless. A shutdown
// (ctx ending) stops the retries, not a try.
func ackConfirmed(ctx context.Context, msg jetstream.Msg, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	for {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(5*time.Second, time.Until(deadline)))
		err := msg.DoubleAck(actx)
		cancel()
		if err == nil || time.Until(deadline) < ackRetryPause || !backoff.Sleep(ctx, ackRetryPause) {
			return err
		}
	}
}

// ackRetryPause is the pause between two tries of an ack.
const ackRetryPause = 250 * time.Millisecond

// backoff is the wait before the next try of msg: RetryDelay doubled for
// every earlier delivery, capped at RetryMaxDelay.
func (n *Notifier) backoff(msg jetstream.Msg) time.Duration {
	failures := 0
	if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
		failures = int(md.NumDelivered - 1)
	}
	return backoff.Doubling(n.cfg.RetryDelay, n.cfg.RetryMaxDelay, failures)
}

// heartbeat tells JetStream the advisory is still being handled until the
// returned stop is called, so a long wait (a slow Telegram, the pace) does
// not hand it to another replica.
func heartbeat(msg jetstream.Msg, every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) { backoff.Sleep(ctx, d) }

// jobURL is the link to the job's dashboard page, if there is a public URL.
func (n *Notifier) jobURL(id string) string {
	if n.cfg.PublicURL == "" {
		return ""
	}
	return strings.TrimRight(n.cfg.PublicURL, "/") + "/ui/jobs/" + id
}
