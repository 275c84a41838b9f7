package notifier

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// A project's budget spent gets one message per window however many jobs
// are held by it, and a usage pause one message however often it is
// lengthened; neither is a failure alert, and a notifier started again
// tells none of them twice.
func TestNoticesOnce(t *testing.T) {
	b, r := setupRunning(t)
	now := time.Now().UTC()
	dayEnd := proto.WindowEnd(proto.WindowDay, now, time.UTC)
	monthEnd := proto.WindowEnd(proto.WindowMonth, now, time.UTC)
	hold := func(id string, until time.Time) {
		t.Helper()
		job := &proto.Job{ID: id, Kind: proto.KindReview, Project: "widgets", Task: proto.Task{ID: "pr-1"}}
		if _, err := b.status.Apply(b.ctx(), job, status.Hold(1, "r1", proto.HoldOverBudget, until, now)); err != nil {
			t.Fatal(err)
		}
	}
	kind := func(sub string) int {
		n := 0
		for _, m := range b.tg.Messages() {
			if strings.Contains(m.Text, sub) {
				n++
			}
		}
		return n
	}
	waitFor := func(sub string, want int) {
		t.Helper()
		natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			if n := kind(sub); n != want {
				return fmt.Errorf("%d messages with %q, want %d", n, sub, want)
			}
			return nil
		})
	}
	hold("held-a", dayEnd)
	hold("held-b", dayEnd)
	// The month's window is another window: one more message, which also
	// shows the day's second hold was watched and told nothing.
	hold("held-c", monthEnd)
	waitFor("budget spent", 2)
	if kind("held-b") != 0 {
		t.Error("a second job held in the same window was told again")
	}

	pauses, err := b.js.KeyValue(b.ctx(), proto.BucketPauses)
	if err != nil {
		t.Fatal(err)
	}
	pause := func(until time.Time) {
		t.Helper()
		data, _ := json.Marshal(proto.Pause{Schema: proto.SchemaVersion, Reason: proto.HoldUsageLimit, Since: now, Until: until, By: "r1", Job: "held-a"})
		if _, err := pauses.Put(b.ctx(), proto.UsagePauseKey("abc123"), data); err != nil {
			t.Fatal(err)
		}
	}
	pause(now.Add(time.Hour))
	pause(now.Add(2 * time.Hour))
	waitFor("usage limit", 1)

	r.stop(t)
	b.start(b.config(), hooks{})
	hold("held-d", now.Add(48*time.Hour))
	waitFor("budget spent", 3)
	if n := kind("usage limit"); n != 1 {
		t.Errorf("%d usage-limit messages after a restart, want 1", n)
	}
	if n := kind("❌"); n != 0 {
		t.Errorf("%d failure alerts for held jobs, want none", n)
	}
}
