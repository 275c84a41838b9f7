package notifier

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/orch-dev/orch/proto"
)

func TestCancelledJobIsNotAlerted(t *testing.T) {
	t.Parallel()
	b, r := setupRunning(t)
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

// Some failures for good reach nobody on Telegram. A MSG_TERMINATED
// whose reason names no job is the server's, not a runner's (nats-server
// sends such for long-acked jobs when a clustered work queue catches up
// after a node restart): no alert, no dead letter. Without a bot token a
// job that failed for good is logged and dead-lettered.
func TestFailureWithoutAlert(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, job, title string
		noToken          bool
		act              action
		wantDLQ          uint64
		wantState        proto.State // "": not checked
		wantLog          string      // "": not checked
	}{
		{name: "server termination", job: "server", title: "Acked long ago", act: actServerTerm, wantDLQ: 0},
		{name: "without token", job: "one", title: "No token", noToken: true, act: actTerm, wantDLQ: 1,
			wantState: proto.StateFailed, wantLog: "job failed for good (no Telegram configured)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.config()
			if tc.noToken {
				cfg.TelegramBotToken, cfg.TelegramChatID = "", ""
			}
			b.start(cfg, hooks{})
			job := b.queue(tc.job, tc.title)
			b.run(map[string]action{job.ID: tc.act})
			b.settled(30 * time.Second)
			if n := b.tg.Requests(); n != 0 {
				t.Errorf("%d requests to Telegram, want 0", n)
			}
			if n := b.streamMsgs(proto.StreamDLQ); n != tc.wantDLQ {
				t.Errorf("DLQ holds %d jobs, want %d", n, tc.wantDLQ)
			}
			if tc.wantState != "" {
				if st, _, err := b.status.Get(b.ctx(), job.ID); err != nil || st.State != tc.wantState {
					t.Errorf("status %+v, %v; want %s", st, err, tc.wantState)
				}
			}
			if tc.wantLog != "" && !b.logged(tc.wantLog) {
				t.Errorf("no log line says %q", tc.wantLog)
			}
		})
	}
}
