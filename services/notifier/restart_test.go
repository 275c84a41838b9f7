package notifier

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

func TestNotifierDownWhileJobsFail(t *testing.T) {
	t.Parallel()
	b, first := setupRunning(t)
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
		var first *running
		assigned := make(chan struct{})
		first = b.start(b.config(), hooks{ackWait: 2 * time.Second, alerted: func(n *Notifier) {
			<-assigned
			// Killed: its connection ends and it does nothing more, so
			// the job stays in JOBS and the advisory unacked.
			n.js.Conn().Close()
			first.cancel()
			crashed.Store(true)
		}})
		close(assigned)
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
