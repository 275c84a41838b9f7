package notifier

import (
	"html"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/status/statustest"
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

func TestEscaping(t *testing.T) {
	t.Parallel()
	b, _ := setupRunning(t)
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

func TestJobLogLines(t *testing.T) {
	t.Parallel()
	b, _ := setupRunning(t)
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
