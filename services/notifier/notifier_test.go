package notifier

import (
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

func TestTerminalFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		act      action
		attempts string // the advisory's deliveries
		reason   string
	}{
		{"max deliveries", actFail, "3", "Reason: failed on every attempt"},
		{"terminated", actTerm, "1", "Reason: terminated: cannot check out branch &lt;agent/x&gt; &amp; more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.config()
			cfg.PublicURL = "https://orch.example.com/"
			cfg.TelegramThreadID = 77
			cfg.HTTPAddr = "127.0.0.1:0"
			r := b.start(cfg, hooks{})
			job := b.queue("one", "Make the widget spin")
			b.run(map[string]action{job.ID: tc.act})
			b.settled(30 * time.Second)

			b.checkDeadLettered(job)
			msgs := b.tg.Messages()
			if len(msgs) != 1 {
				t.Fatalf("%d messages, want 1", len(msgs))
			}
			m := msgs[0]
			if m.Chat != "-1001234" || m.Thread != 77 || m.ParseMode != "HTML" {
				t.Errorf("sent to chat %s thread %d in %q mode, want -1001234, 77, HTML", m.Chat, m.Thread, m.ParseMode)
			}
			for _, want := range []string{
				"<b>orch: review failed</b> in <b>widgets</b>",
				`Task: <a href="https://git.example.com/acme/widgets/pulls/42">Make the widget spin</a> (pr-one, PR #42)`,
				"Attempts: " + tc.attempts + " of 3",
				"Exit code: 3",
				tc.reason,
				"Cost: $0.42 (7 turns)",
				"Job: <code>" + job.ID + "</code>",
				`<a href="https://orch.example.com/ui/jobs/` + job.ID + `">details</a>`,
				"Error: agent exited with code 3: want &lt;expected&gt;",
				"agent line 39\nFAIL: want &lt;expected&gt; &amp; got &lt;nil&gt;</pre>",
			} {
				if !strings.Contains(m.Text, want) {
					t.Errorf("alert lacks %q:\n%s", want, m.Text)
				}
			}
			if strings.Contains(m.Text, "agent line 20\n") {
				t.Errorf("alert shows more than the last lines of the log:\n%s", m.Text)
			}

			// The dead letter: the job itself, with why, how often and when.
			dlq, err := b.js.Stream(b.ctx(), proto.StreamDLQ)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := dlq.GetLastMsgForSubject(b.ctx(), proto.DLQSubject("widgets", proto.KindReview))
			if err != nil {
				t.Fatal(err)
			}
			got, err := proto.DecodeJob(raw.Data)
			if err != nil || got.ID != job.ID || got.Task.Title != job.Task.Title {
				t.Errorf("DLQ holds %+v (%v), want job %s", got, err, job.ID)
			}
			if raw.Header.Get(proto.HeaderDLQAttempts) != tc.attempts || raw.Header.Get(proto.HeaderDLQReason) == "" {
				t.Errorf("DLQ headers %v", raw.Header)
			}
			if _, err := time.Parse(time.RFC3339, raw.Header.Get(proto.HeaderDLQTime)); err != nil {
				t.Errorf("DLQ time header: %v", err)
			}

			// The metrics, as Prometheus scrapes them.
			resp, err := http.Get("http://" + r.n.metrics.addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{
				"orch_notifier_alerts_sent_total 1",
				"orch_notifier_dlq_messages 1",
				"orch_notifier_dead_lettered_total 1",
				`orch_notifier_advisories_total{outcome="alerted"} 1`,
				`orch_notifier_alerts_failed_total{cause="rejected"} 0`,
				"orch_notifier_alerts_rate_limited_total 0",
			} {
				if !strings.Contains(string(body), want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}

func TestRateLimitedTwiceThenAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tg.SetAnswer(func(n int) (int, string) {
		if n <= 2 {
			return http.StatusTooManyRequests, testkit.Answer429
		}
		return http.StatusOK, ""
	})
	r := b.start(b.config(), hooks{})
	job := b.queue("one", "Rate limited")
	began := time.Now()
	b.run(map[string]action{job.ID: actFail})
	b.settled(30 * time.Second)

	b.checkDeadLettered(job)
	if n := b.tg.Requests(); n != 3 {
		t.Errorf("%d requests, want 3 (429, 429, 200)", n)
	}
	if d := time.Since(began); d < 2*time.Second {
		t.Errorf("done after %v: retry_after 1 was not honoured twice", d)
	}
	if n := testutil.ToFloat64(r.n.metrics.rateLimited); n != 2 {
		t.Errorf("rate-limited counter %v, want 2", n)
	}
}

func TestTelegramDownForAWhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var up atomic.Bool
	b.tg.SetAnswer(func(int) (int, string) {
		if !up.Load() {
			return http.StatusInternalServerError, testkit.Answer500
		}
		return http.StatusOK, ""
	})
	r := b.start(b.config(), hooks{})
	jobs := map[string]action{}
	var all []*proto.Job
	for i := range 3 {
		j := b.queue(strconv.Itoa(i), "Down "+strconv.Itoa(i))
		jobs[j.ID], all = actFail, append(all, j)
	}
	b.run(jobs)
	// Several tries fail. Alerts go out in order (MaxAckPending 1), so
	// the others wait behind the first, whose job is dead-lettered
	// already.
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := b.tg.Requests(); n < 6 {
			return fmt.Errorf("%d requests", n)
		}
		if n := b.streamMsgs(proto.StreamDLQ); n < 1 {
			return fmt.Errorf("DLQ holds %d jobs during the outage, want at least 1", n)
		}
		return nil
	})
	if n := len(b.tg.Messages()); n != 0 {
		t.Fatalf("%d messages accepted while Telegram answered 500", n)
	}
	up.Store(true)
	b.settled(30 * time.Second)
	b.checkDeadLettered(all...)
	if n := testutil.ToFloat64(r.n.metrics.failed.WithLabelValues("unavailable")); n < 6 {
		t.Errorf("failed{unavailable} = %v, want at least 6", n)
	}
}

func TestNotifierDownWhileJobsFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.start(b.config(), hooks{})
	first.stop(t)

	jobs := map[string]action{}
	var all []*proto.Job
	for i, act := range []action{actFail, actTerm, actFail} {
		j := b.queue(strconv.Itoa(i), "While down "+strconv.Itoa(i))
		jobs[j.ID], all = act, append(all, j)
	}
	b.run(jobs)
	if n := b.tg.Requests(); n != 0 {
		t.Fatalf("%d requests with no notifier running", n)
	}
	// JetStream itself restarts too, on the same store.
	if err := b.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	b.start(b.config(), hooks{})
	b.settled(60 * time.Second)
	b.checkDeadLettered(all...)
	if n := len(b.tg.Messages()); n != 3 {
		t.Errorf("%d messages, want 3", n)
	}
}

func TestCrashAfterTelegramAccepted(t *testing.T) {
	t.Parallel()
	t.Run("shutdown as Telegram accepts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var first atomic.Pointer[running]
		b.tg.SetOnAccept(func(testkit.TelegramMessage) {
			if r := first.Load(); r != nil {
				r.cancel() // SIGTERM while the answer is on its way
			}
		})
		first.Store(b.start(b.config(), hooks{ackWait: 2 * time.Second}))
		job := b.queue("one", "Shutdown")
		b.run(map[string]action{job.ID: actFail})
		natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			if len(b.tg.Messages()) == 0 {
				return errors.New("no message yet")
			}
			return nil
		})
		first.Load().stop(t)
		b.tg.SetOnAccept(nil)

		b.start(b.config(), hooks{ackWait: 2 * time.Second})
		b.settled(30 * time.Second)
		b.checkDeadLettered(job)
	})
	t.Run("killed after the marker, before the ack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var crashed atomic.Bool
		first := b.start(b.config(), hooks{ackWait: 2 * time.Second, crashAfterAlert: func() bool {
			return !crashed.Swap(true)
		}})
		job := b.queue("one", "Killed")
		b.run(map[string]action{job.ID: actFail})
		natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			if !crashed.Load() {
				return errors.New("not crashed yet")
			}
			return nil
		})
		first.stop(t)
		// The advisory is still unacked; a new notifier gets it after
		// AckWait and must find the marker.
		b.start(b.config(), hooks{ackWait: 2 * time.Second})
		b.settled(30 * time.Second)
		b.checkDeadLettered(job)
		if n := b.tg.Requests(); n != 1 {
			t.Errorf("%d requests to Telegram, want 1", n)
		}
	})
}

func TestCancelledJobIsNotAlerted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.start(b.config(), hooks{})
	cancelled := b.queue("cancelled", "Cancelled while running")
	if _, err := b.status.Cancel(b.ctx(), cancelled.ID); err != nil {
		t.Fatal(err)
	}
	// A job cancelled by its record, whose last delivery the runner NAKed.
	cancelledLate := b.queue("late", "Cancelled, then NAKed")
	if _, err := b.status.Cancel(b.ctx(), cancelledLate.ID); err != nil {
		t.Fatal(err)
	}
	b.run(map[string]action{cancelled.ID: actCancel, cancelledLate.ID: actFail})
	b.settled(30 * time.Second)
	if n := b.tg.Requests(); n != 0 {
		t.Errorf("%d messages for cancelled jobs, want 0", n)
	}
	if n := b.streamMsgs(proto.StreamDLQ); n != 0 {
		t.Errorf("DLQ holds %d cancelled jobs, want 0", n)
	}
	if n := b.streamMsgs(proto.StreamJobs); n != 0 {
		t.Errorf("JOBS holds %d messages, want 0", n)
	}
	for _, id := range []string{cancelled.ID, cancelledLate.ID} {
		if st, _, err := b.status.Get(b.ctx(), id); err != nil || st.State != proto.StateCancelled {
			t.Errorf("job %s: %+v, %v; want cancelled", id, st, err)
		}
	}
	if n := testutil.ToFloat64(r.n.metrics.advisories.WithLabelValues(outcomeCancelled)); n != 2 {
		t.Errorf("advisories{cancelled} = %v, want 2", n)
	}
}

// A MSG_TERMINATED whose reason names no job is the server's, not a
// runner's (nats-server sends such for long-acked jobs when a clustered
// work queue catches up after a node restart): no alert, no dead letter.
func TestServerTerminationIsNotAlerted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(b.config(), hooks{})
	job := b.queue("server", "Acked long ago")
	b.run(map[string]action{job.ID: actServerTerm})
	b.settled(30 * time.Second)
	if n := b.tg.Requests(); n != 0 {
		t.Errorf("%d messages for a server termination, want 0", n)
	}
	if n := b.streamMsgs(proto.StreamDLQ); n != 0 {
		t.Errorf("DLQ holds %d jobs, want 0", n)
	}
}

// Thirty jobs fail at once, with two notifier replicas sharing the
// consumer: every job is alerted exactly once and the pace per chat holds
// across both.
func TestManyFailuresAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rate = 10.0
	cfg := b.config()
	cfg.TelegramRate = rate
	b.start(cfg, hooks{})
	b.start(cfg, hooks{})
	jobs := map[string]action{}
	var all []*proto.Job
	for i := range 30 {
		j := b.queue(strconv.Itoa(i), "Many "+strconv.Itoa(i))
		act := actFail
		if i%3 == 0 {
			act = actTerm
		}
		jobs[j.ID], all = act, append(all, j)
	}
	b.run(jobs)
	b.settled(90 * time.Second)
	b.checkDeadLettered(all...)

	msgs := b.tg.Messages()
	if len(msgs) != 30 {
		t.Fatalf("%d messages, want 30", len(msgs))
	}
	times := make([]time.Time, len(msgs))
	for i, m := range msgs {
		times[i] = m.At
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	interval := time.Duration(float64(time.Second) / rate)
	// Loose: the whole run took at least most of 29 intervals, and
	// hardly two messages came closer than half an interval.
	if span := times[len(times)-1].Sub(times[0]); span < 29*interval*8/10 {
		t.Errorf("30 messages within %v, want at least %v at %v/s", span, 29*interval*8/10, rate)
	}
	close := 0
	for i := 1; i < len(times); i++ {
		if times[i].Sub(times[i-1]) < interval/2 {
			close++
		}
	}
	if close > 5 {
		t.Errorf("%d of 29 gaps shorter than %v", close, interval/2)
	}
}

func TestEscaping(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(b.config(), hooks{})
	title := `Fix <div class="x"> & </div> 🚀 Починить виджет & <b>bold</b>`
	job := b.queue("escape", title)
	errText := "ошибка: <nil> & 💥 ✓ Ünïcödé > all"
	statustest.Set(t, b.status, job, func(s *proto.Status) { s.Error = errText })
	b.run(map[string]action{job.ID: actFail})
	b.settled(30 * time.Second)
	msgs := b.tg.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	text := msgs[0].Text
	for _, want := range []string{
		`Fix &lt;div class="x"&gt; &amp; &lt;/div&gt; 🚀 Починить виджет &amp; &lt;b&gt;bold&lt;/b&gt;`,
		"ошибка: &lt;nil&gt; &amp; 💥 ✓ Ünïcödé &gt; all",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("alert lacks %q:\n%s", want, text)
		}
	}
	// What a person reads, once Telegram has parsed the HTML.
	shown := html.UnescapeString(stripTags(text))
	for _, want := range []string{title, errText} {
		if !strings.Contains(shown, want) {
			t.Errorf("reader does not see %q in:\n%s", want, shown)
		}
	}
}

// stripTags removes the tags the alert uses, as Telegram's parser would.
func stripTags(s string) string {
	var b strings.Builder
	in := false
	for _, r := range s {
		switch {
		case r == '<':
			in = true
		case r == '>' && in:
			in = false
		case !in:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestRejectedIsKeptNotSpunOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fixed atomic.Bool
	b.tg.SetAnswer(func(n int) (int, string) {
		if fixed.Load() {
			return http.StatusOK, ""
		}
		if n%2 == 1 {
			return http.StatusUnauthorized, testkit.Answer401
		}
		return http.StatusBadRequest, testkit.Answer400
	})
	cfg := b.config()
	cfg.RejectedDelay = 3 * time.Second
	r := b.start(cfg, hooks{})
	job := b.queue("one", "Bad token")
	b.run(map[string]action{job.ID: actFail})
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := testutil.ToFloat64(r.n.metrics.failed.WithLabelValues("rejected")); n != 1 {
			return fmt.Errorf("failed{rejected} = %v", n)
		}
		return nil
	})
	// Dead-lettered at once, even though nobody could be told.
	if n := b.streamMsgs(proto.StreamDLQ); n != 1 {
		t.Errorf("DLQ holds %d, want 1", n)
	}
	if st, _, err := b.status.Get(b.ctx(), job.ID); err != nil || st.State != proto.StateFailed || st.Alerted {
		t.Errorf("status %+v, %v; want failed, not alerted", st, err)
	}
	// Not spun on: one try, then quiet until the delay has passed.
	time.Sleep(time.Second)
	if n := b.tg.Requests(); n != 1 {
		t.Errorf("%d requests within a second of a 401, want 1", n)
	}
	if !b.logged("TELEGRAM REJECTS ALERTS") {
		t.Error("a rejected alert was not logged loudly")
	}
	fixed.Store(true) // the operator fixes the token
	b.settled(30 * time.Second)
	b.checkDeadLettered(job)
}

func TestWithoutTokenLogsAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.TelegramBotToken, cfg.TelegramChatID = "", ""
	b.start(cfg, hooks{})
	job := b.queue("one", "No token")
	b.run(map[string]action{job.ID: actTerm})
	b.settled(30 * time.Second)
	if n := b.tg.Requests(); n != 0 {
		t.Errorf("%d requests without a token", n)
	}
	if n := b.streamMsgs(proto.StreamDLQ); n != 1 {
		t.Errorf("DLQ holds %d, want 1", n)
	}
	if st, _, err := b.status.Get(b.ctx(), job.ID); err != nil || st.State != proto.StateFailed {
		t.Errorf("status %+v, %v; want failed", st, err)
	}
	if !b.logged("job failed for good (no Telegram configured)") {
		t.Error("the alert was not logged")
	}
}

func TestJobLogLines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(b.config(), hooks{})
	job := b.queue("one", "Logs")
	b.run(map[string]action{job.ID: actFail})
	b.settled(30 * time.Second)
	lines := 0
	for _, e := range b.logs.All() {
		fields := e.ContextMap()
		if _, ok := fields["advisory"]; !ok {
			continue
		}
		lines++
		if fields["job"] != job.ID {
			t.Errorf("log line about a job without its id: %q %v", e.Message, fields)
		}
	}
	if lines == 0 {
		t.Error("no log lines about the advisory")
	}
}

// logged reports whether a log line contains s.
func (b *bundle) logged(s string) bool {
	for _, e := range b.logs.All() {
		if strings.Contains(e.Message, s) {
			return true
		}
	}
	return false
}

func TestConfig(t *testing.T) {
	t.Parallel()
	var c Config
	c.SetDefaults()
	if c.TelegramRate != 1 || c.RetryDelay != 10*time.Second || c.RejectedDelay != 5*time.Minute || c.HTTPAddr != "" {
		t.Errorf("defaults: %+v", c)
	}
	// An explicit zero from the environment stands, through Run's
	// SetDefaults too; an unset variable takes its default.
	var z Config
	if err := service.Parse(&z, map[string]string{"ORCH_NOTIFY_RETRY_DELAY": "0"}); err != nil {
		t.Fatal(err)
	}
	z.SetDefaults()
	if z.RetryDelay != 0 || z.RetryMaxDelay != 5*time.Minute || z.TelegramRate != 1 || z.HTTPAddr != ":8082" {
		t.Errorf("ORCH_NOTIFY_RETRY_DELAY=0 gave %+v", z)
	}
	for _, bad := range []Config{
		{TelegramBotToken: "x"},
		{TelegramRate: -1},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", bad)
		}
	}
}
