// Package notifier turns JetStream's terminal-failure advisories for JOBS
// into one Telegram alert each, and moves the failed job to JOBS_DLQ.
package notifier

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/proto/status"
	"github.com/orch-dev/orch/services/notifier/alert"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

// Defaults of the notifier's settings.
const (
	// RetryDelayDefault is the wait before an advisory is tried again
	// after Telegram failed without saying how long to wait.
	RetryDelayDefault = 10 * time.Second
	// RejectedDelay is the wait after Telegram rejected a message (bad
	// token or chat): long, since only an operator can fix it.
	RejectedDelay = 5 * time.Minute
	ackWait       = time.Minute
)

// Config is the notifier's configuration, read from ORCH_ variables.
type Config struct {
	service.Common
	// TelegramBotToken and TelegramChatID say where alerts go; without a
	// token, alerts are only logged (the DLQ is still filled).
	TelegramBotToken string `env:"TELEGRAM_BOT_TOKEN"`
	TelegramChatID   string `env:"TELEGRAM_CHAT_ID"`
	// TelegramThreadID is the forum topic of the chat, if any.
	TelegramThreadID int `env:"TELEGRAM_THREAD_ID"`
	// TelegramAPIURL is the Bot API base. Default https://api.telegram.org.
	TelegramAPIURL string `env:"TELEGRAM_API_URL"`
	// PublicURL is the gateway's base URL, for a link to the job.
	PublicURL string `env:"PUBLIC_URL"`
	// RetryDelay is the wait after a failed send. Default 10s.
	RetryDelay time.Duration `env:"NOTIFY_RETRY_DELAY"`
}

// SetDefaults fills the zero fields with their defaults.
func (c *Config) SetDefaults() {
	c.Common.SetDefaults()
	c.TelegramAPIURL = cmp.Or(c.TelegramAPIURL, telegram.APIURLDefault)
	c.RetryDelay = cmp.Or(c.RetryDelay, RetryDelayDefault)
}

// Validate reports a configuration the notifier cannot run with.
func (c *Config) Validate() error {
	if c.TelegramBotToken != "" && c.TelegramChatID == "" {
		return errors.New("ORCH_TELEGRAM_CHAT_ID is required with ORCH_TELEGRAM_BOT_TOKEN")
	}
	return nil
}

// Notifier handles advisories.
type Notifier struct {
	cfg    Config
	log    *zap.Logger
	js     jetstream.JetStream
	status *status.Store
	tg     *telegram.Client // nil: log only
}

// Run handles advisories until ctx is cancelled.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	nc, js, kv, err := service.Connect(ctx, cfg.Common, "notifier", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	n := &Notifier{cfg: cfg, log: log, js: js, status: status.New(kv)}
	if cfg.TelegramBotToken != "" {
		n.tg = &telegram.Client{BaseURL: cfg.TelegramAPIURL, Token: cfg.TelegramBotToken, ChatID: cfg.TelegramChatID, ThreadID: cfg.TelegramThreadID}
	} else {
		log.Warn("no ORCH_TELEGRAM_BOT_TOKEN: alerts are only logged")
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, proto.StreamAdvisories, proto.NotifierConsumer(-1, ackWait))
	if err != nil {
		return fmt.Errorf("ensuring consumer %s: %w", proto.ConsumerNotifier, err)
	}
	// The handler is serial, which keeps alerts in order and within
	// Telegram's rate per chat.
	cc, err := cons.Consume(func(msg jetstream.Msg) { n.handle(ctx, msg) },
		jetstream.PullMaxMessages(1),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { log.Debug("consume", zap.Error(err)) }),
	)
	if err != nil {
		return fmt.Errorf("consuming: %w", err)
	}
	log.Info("notifier started", zap.Bool("telegram", n.tg != nil))
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	log.Info("notifier stopped")
	return nil
}

// handle acts on one advisory and settles it: acked once the failure is
// alerted and dead-lettered, NAKed with a delay when Telegram or NATS
// failed, so nothing is dropped.
func (n *Notifier) handle(ctx context.Context, msg jetstream.Msg) {
	adv, err := proto.DecodeAdvisory(msg.Data())
	if err != nil {
		n.log.Error("dropping unusable advisory", zap.String("subject", msg.Subject()), zap.Error(err))
		_ = msg.Term()
		return
	}
	log := n.log.With(zap.String("advisory", adv.ID), zap.Uint64("stream_seq", adv.StreamSeq))
	if adv.Type == proto.AdvisoryTerminated && adv.Reason == proto.ReasonCancelled {
		log.Info("job cancelled: no alert")
		_ = msg.Ack()
		return
	}
	delay, err := n.process(ctx, log, adv)
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down: the advisory comes back after AckWait
		}
		log.Warn("advisory will be retried", zap.Duration("delay", delay), zap.Error(err))
		_ = msg.NakWithDelay(delay)
		return
	}
	_ = msg.Ack()
}

// process alerts on and dead-letters one failed job. On error it returns
// how long to wait before trying again. Each step is safe to repeat.
func (n *Notifier) process(ctx context.Context, log *zap.Logger, adv *proto.Advisory) (time.Duration, error) {
	st, attempts, reason, err := n.failure(ctx, adv)
	if errors.Is(err, errHandled) {
		log.Info("job no longer in JOBS: nothing left to do")
		return 0, nil
	}
	if err != nil {
		return n.cfg.RetryDelay, err
	}
	log = log.With(zap.String("job", st.Job.ID), zap.String("project", st.Job.Project), zap.String("kind", string(st.Job.Kind)))

	if !st.Alerted {
		if err := n.alert(ctx, log, st, attempts, reason); err != nil {
			var rl *telegram.RateLimitedError
			switch {
			case errors.As(err, &rl):
				return rl.RetryAfter, err
			case errors.Is(err, telegram.ErrRejected):
				log.Error("TELEGRAM REJECTS ALERTS: check ORCH_TELEGRAM_BOT_TOKEN and ORCH_TELEGRAM_CHAT_ID", zap.Error(err))
				return RejectedDelay, err
			}
			return n.cfg.RetryDelay, err
		}
		// The marker that keeps a crash after this point from alerting
		// twice.
		if st, err = n.status.Update(ctx, &st.Job, func(s *proto.Status) bool { s.Alerted = true; return true }); err != nil {
			return n.cfg.RetryDelay, err
		}
	}

	seq, err := n.deadLetter(ctx, st, attempts, reason)
	if err != nil {
		return n.cfg.RetryDelay, err
	}
	if _, err := n.status.Update(ctx, &st.Job, func(s *proto.Status) bool {
		s.State, s.DLQSeq, s.Attempt = proto.StateFailed, seq, max(s.Attempt, attempts)
		if s.FinishedAt.IsZero() {
			s.FinishedAt = time.Now().UTC()
		}
		return true
	}); err != nil {
		return n.cfg.RetryDelay, err
	}
	// Last, so that an advisory whose job is gone from JOBS is one that
	// was handled in full.
	if adv.Type == proto.AdvisoryMaxDeliveries {
		if err := n.removeJob(ctx, adv.StreamSeq); err != nil {
			return n.cfg.RetryDelay, err
		}
	}
	log.Info("job failed for good: alerted and dead-lettered", zap.Uint64("dlq_seq", seq))
	return 0, nil
}

// failure finds the job an advisory is about. A job that hit MaxDeliver is
// still in JOBS; a terminated one is gone from it, and its Term reason
// names its status record.
func (n *Notifier) failure(ctx context.Context, adv *proto.Advisory) (*proto.Status, int, string, error) {
	attempts := int(adv.Deliveries)
	if adv.Type == proto.AdvisoryTerminated {
		id, cause := proto.ParseTermReason(adv.Reason)
		if id == "" {
			return nil, 0, "", fmt.Errorf("terminated job without an id in its reason %q", adv.Reason)
		}
		st, _, err := n.status.Get(ctx, id)
		return st, attempts, "terminated: " + cause, err
	}
	reason := "failed on every attempt"
	stream, err := n.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return nil, 0, "", err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Removed by an earlier try of this advisory, whose last step
		// that is, or acked by a runner that finished late.
		return nil, 0, "", errHandled
	}
	if err != nil {
		return nil, 0, "", fmt.Errorf("reading job at JOBS seq %d: %w", adv.StreamSeq, err)
	}
	job, err := proto.DecodeJob(raw.Data)
	if err != nil && (job == nil || job.ID == "") {
		return nil, 0, "", fmt.Errorf("job at JOBS seq %d: %w", adv.StreamSeq, err)
	}
	st, err := n.status.Update(ctx, job, func(*proto.Status) bool { return false })
	return st, attempts, reason, err
}

// alert sends (or, without Telegram, logs) the message of one failure.
func (n *Notifier) alert(ctx context.Context, log *zap.Logger, st *proto.Status, attempts int, reason string) error {
	f := alert.Failure{Status: st, Attempts: attempts, Reason: reason, LogTail: alert.LogTail(st.Log, alert.LogTailLines)}
	if n.cfg.PublicURL != "" {
		f.JobURL = strings.TrimRight(n.cfg.PublicURL, "/") + "/jobs/" + st.Job.ID
	}
	text := alert.Render(f)
	if n.tg == nil {
		log.Warn("job failed for good (no Telegram configured)", zap.String("alert", text))
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := n.tg.Send(sctx, text); err != nil {
		return err
	}
	log.Info("alert sent")
	return nil
}

// deadLetter copies the job to JOBS_DLQ, deduplicated by job id so that a
// repeat is harmless, and returns its sequence there.
func (n *Notifier) deadLetter(ctx context.Context, st *proto.Status, attempts int, reason string) (uint64, error) {
	data, err := json.Marshal(st.Job)
	if err != nil {
		return 0, err
	}
	m := nats.NewMsg(proto.DLQSubject(st.Job.Project, st.Job.Kind))
	m.Data = data
	m.Header.Set(proto.HeaderMsgID, "dlq-"+st.Job.ID)
	m.Header.Set(proto.HeaderDLQReason, reason)
	m.Header.Set(proto.HeaderDLQAttempts, strconv.Itoa(attempts))
	m.Header.Set(proto.HeaderDLQTime, time.Now().UTC().Format(time.RFC3339))
	ack, err := n.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, fmt.Errorf("publishing to %s: %w", proto.StreamDLQ, err)
	}
	return ack.Sequence, nil
}

// removeJob deletes a dead-lettered job from JOBS.
func (n *Notifier) removeJob(ctx context.Context, seq uint64) error {
	stream, err := n.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return err
	}
	if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("removing job from %s: %w", proto.StreamJobs, err)
	}
	return nil
}

// errHandled marks an advisory whose work is already done.
var errHandled = errors.New("advisory already handled")
