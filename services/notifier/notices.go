package notifier

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

// Notices: what is no failure but a person should know, told once each.
// A job held because its project's budget is spent gets one message per
// project and budget window ("budget spent", what is held, when the
// window resets); a usage-limit pause (KV pauses) gets one message, at
// its start. Neither is a failure: no advisory, no dead letter. The
// notifier watches the status bucket for held records and the pauses
// bucket for pauses; a notice is claimed by creating its key in the
// write-back bucket (noticeKey) before it is sent, so replicas and
// restarts tell it once; a send that fails gives the claim back, to be
// tried again at the next change or restart.

// noticeRetry is how long a notice that could not be sent waits before it
// is tried again.
const noticeRetry = 30 * time.Second

// noticeKey is the write-back bucket's key claiming a notice.
func noticeKey(kind string, parts ...string) string {
	return "notice." + kind + "." + strings.Join(parts, ".")
}

// notices tells of holds and pauses until ctx ends.
func (n *Notifier) notices(ctx context.Context, js jetstream.JetStream, jobs jetstream.KeyValue) {
	log := n.log.Named("notices")
	var claims, pauses jetstream.KeyValue
	for ctx.Err() == nil {
		var err error
		if claims == nil {
			claims, err = proto.EnsureBucket(ctx, js, n.cfg.Topology().WritebackBucket())
		}
		if err == nil && pauses == nil {
			pauses, err = js.KeyValue(ctx, proto.BucketPauses)
		}
		if err == nil {
			err = n.watchNotices(ctx, log, jobs, pauses, claims)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("watching for holds and pauses; trying again", zap.Error(err))
		}
		sleep(ctx, noticeRetry)
	}
}

// watchNotices is one watch of held records and pauses.
func (n *Notifier) watchNotices(ctx context.Context, log *zap.Logger, jobs, pauses, claims jetstream.KeyValue) error {
	wj, err := jobs.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = wj.Stop() }()
	wp, err := pauses.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = wp.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-wj.Updates():
			if !ok {
				return errors.New("status watch ended")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			st, err := proto.DecodeStatus(e.Value())
			if err != nil || st.State != proto.StateHeld || st.HeldReason != proto.HoldOverBudget {
				continue
			}
			key := noticeKey("budget", st.Job.Project, strconv.FormatInt(st.HeldUntil.Unix(), 10))
			n.notice(ctx, log.With(zap.String("job", st.Job.ID)), claims, key, budgetNotice(st, n.jobURL(st.Job.ID)))
		case e, ok := <-wp.Updates():
			if !ok {
				return errors.New("pauses watch ended")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut || !strings.HasPrefix(e.Key(), proto.PauseUsagePrefix) {
				continue
			}
			pz, err := proto.DecodePause(e.Value())
			if err != nil || !pz.Active(time.Now()) {
				continue
			}
			key := noticeKey("pause", strings.TrimPrefix(e.Key(), proto.PauseUsagePrefix), strconv.FormatInt(pz.Since.Unix(), 10))
			n.notice(ctx, log.With(zap.String("pause", e.Key())), claims, key, pauseNotice(e.Key(), pz, n.jobURL(pz.Job)))
		}
	}
}

// notice sends text once for key: it claims the key, sends, and gives
// the claim back when the send failed.
func (n *Notifier) notice(ctx context.Context, log *zap.Logger, claims jetstream.KeyValue, key, text string) {
	if _, err := claims.Create(ctx, key, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			log.Warn("claiming notice", zap.String("notice", key), zap.Error(err))
		}
		return
	}
	if n.tg == nil {
		log.Info("notice (no Telegram configured)", zap.String("notice", key), zap.String("text", text))
		n.metrics.notices.WithLabelValues(strings.Split(key, ".")[1]).Inc()
		return
	}
	err := n.tg.Wait(ctx)
	if err == nil {
		err = n.tg.Send(ctx, text)
	}
	if err != nil {
		log.Warn("sending notice; it is tried again at the next change", zap.String("notice", key), zap.Error(err))
		_ = claims.Delete(context.WithoutCancel(ctx), key)
		return
	}
	n.metrics.notices.WithLabelValues(strings.Split(key, ".")[1]).Inc()
	log.Info("notice sent", zap.String("notice", key))
}

// budgetNotice is the message of a project whose budget is spent.
func budgetNotice(st *proto.Status, url string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "💸 <b>orch · budget spent</b> · %s\n", telegram.Escape(st.Job.Project))
	fmt.Fprintf(&b, "New jobs of the project are held, not run and not failed, until the budget window resets at %s or the budget is raised (registry, SIGHUP).\n",
		telegram.Escape(st.HeldUntil.UTC().Format("2006-01-02 15:04 MST")))
	fmt.Fprintf(&b, "Held: %s %s of %s", telegram.Escape(string(st.Job.Kind)), telegram.Escape(st.Job.ID), telegram.Escape(st.Job.Task.ID))
	if url != "" {
		fmt.Fprintf(&b, " · <a href=\"%s\">job</a>", strings.ReplaceAll(telegram.Escape(url), `"`, "&quot;"))
	}
	b.WriteString("\nRun one anyway: POST /jobs/{id}/release.")
	return b.String()
}

// pauseNotice is the message of a usage-limit pause.
func pauseNotice(key string, pz *proto.Pause, url string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "⏸ <b>orch · usage limit</b> · credential %s\n", telegram.Escape(strings.TrimPrefix(key, proto.PauseUsagePrefix)))
	fmt.Fprintf(&b, "No runner starts an agent on this credential until %s; work resumes by itself then, oldest first. No job failed.\n",
		telegram.Escape(pz.Until.UTC().Format("2006-01-02 15:04 MST")))
	if pz.Job != "" {
		fmt.Fprintf(&b, "Met by job %s", telegram.Escape(pz.Job))
		if url != "" {
			fmt.Fprintf(&b, " · <a href=\"%s\">job</a>", strings.ReplaceAll(telegram.Escape(url), `"`, "&quot;"))
		}
		b.WriteString("\n")
	}
	if pz.Note != "" {
		fmt.Fprintf(&b, "<code>%s</code>", telegram.Escape(pz.Note))
	}
	return b.String()
}
