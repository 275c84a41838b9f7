package notifier

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/proto"
)

// An undecodable job that reaches MaxDeliver is known by one name: the
// runner's record of it, under proto.UndecodableJobID, is the one the
// notifier dead-letters and alerts on; and a record an older notifier
// left under its own name (jobs-seq-N) is read too, so a job it alerted
// on is not alerted on again.
func TestUndecodableJobOneName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// older: the record is an older notifier's, alerted already.
		older bool
	}{
		{"runner's record", false},
		{"older notifier's record", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, _ := setupRunning(t)
			ack, err := b.js.Publish(b.ctx(), proto.JobSubject("widgets", proto.KindReview), []byte("{not json"))
			if err != nil {
				t.Fatal(err)
			}
			seq := strconv.FormatUint(ack.Sequence, 10)
			id := proto.UndecodableJobID(ack.Sequence)
			if tc.older {
				id = "jobs-seq-" + seq
			}
			placeholder := &proto.Job{ID: id, Kind: "unknown", Project: "unknown", Task: proto.Task{ID: "unknown"}}
			statustest.Set(t, b.status, placeholder, func(st *proto.Status) {
				st.State, st.Attempt, st.MaxAttempts = proto.StateFailed, 1, b.attempt
				st.Error = "decoding job: invalid character 'n'"
				if tc.older {
					st.DLQSeq, st.Alerted = 1, true
				}
			})
			b.nakUntilMaxDeliver()
			b.settled(30 * time.Second)

			st, _, err := b.status.Get(b.ctx(), id)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != proto.StateFailed || !st.Alerted || st.DLQSeq == 0 {
				t.Errorf("record %s: %+v, want failed, alerted, dead-lettered", id, st)
			}
			other := "jobs-seq-" + seq
			if tc.older {
				other = proto.UndecodableJobID(ack.Sequence)
			}
			if _, _, err := b.status.Get(b.ctx(), other); !errors.Is(err, status.ErrNotFound) {
				t.Errorf("record %s: %v, want none: the job has one name", other, err)
			}
			msgs := b.tg.Messages()
			switch {
			case tc.older && len(msgs) != 0:
				t.Errorf("%d messages about a job alerted on before, want none", len(msgs))
			case !tc.older && (len(msgs) != 1 || !strings.Contains(msgs[0].Text, id) || !strings.Contains(msgs[0].Text, "decoding job")):
				t.Errorf("messages %+v, want one naming %s with the runner's cause", msgs, id)
			}
			if n := b.streamMsgs(proto.StreamJobs); n != 0 {
				t.Errorf("JOBS holds %d messages, want 0", n)
			}
		})
	}
}

// nakUntilMaxDeliver plays a runner that cannot terminate the jobs it is
// given: it NAKs every delivery until JetStream gives up on them, which
// its MAX_DELIVERIES advisory says.
func (b *bundle) nakUntilMaxDeliver() {
	t := b.t
	t.Helper()
	want := b.advisories() + 1
	natstest.CheckFor(t, 60*time.Second, time.Millisecond, func() error {
		batch, err := b.runner.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			if err := msg.Nak(); err != nil {
				t.Fatalf("fake runner: %v", err)
			}
		}
		if got := b.advisories(); got < want {
			return fmt.Errorf("%d advisories, want %d", got, want)
		}
		return nil
	})
}
