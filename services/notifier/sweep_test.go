package notifier

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// A job whose deliveries are used up, whose MAX_DELIVERIES advisory was
// lost (published while JOBS_ADVISORIES changed leader), is found by the
// sweep and handled as the advisory would have been: dead-lettered,
// alerted once, gone from JOBS. While a runner holds a later job the
// lost one is not told from it (nats-server's ack floor stays below the
// lost one), and neither is touched; it is found once nothing is pending.
func TestSweepStandsInForALostAdvisory(t *testing.T) {
	t.Parallel()
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			lost := b.queue("lost", "Advisory lost in an election")
			b.run(map[string]action{lost.ID: actFail})
			// The advisory is lost, as when its stream had no leader.
			advs, err := b.js.Stream(b.ctx(), proto.StreamAdvisories)
			if err != nil {
				t.Fatal(err)
			}
			if err := advs.Purge(b.ctx()); err != nil {
				t.Fatal(err)
			}
			sweeps := make(chan int, 100)
			h := hooks{sweepEvery: 50 * time.Millisecond, swept: func(found int) {
				select {
				case sweeps <- found:
				default: // the test reads the first few
				}
			}}
			if !busy {
				b.start(b.config(), h)
				b.waitFailed(lost)
				b.settled(30 * time.Second)
				if n := b.streamMsgs(proto.StreamJobs); n != 0 {
					t.Errorf("JOBS holds %d jobs, want 0", n)
				}
			} else {
				// A job after it done, and one after that still running.
				b.queue("done", "Done")
				held := b.queue("held", "Still running")
				msgs := b.deliver(2)
				if err := msgs[0].DoubleAck(b.ctx()); err != nil {
					t.Fatal(err)
				}
				b.start(b.config(), h)
				for range 3 {
					select {
					case found := <-sweeps:
						if found != 0 {
							t.Fatalf("a sweep found %d jobs while one ran", found)
						}
					case <-time.After(30 * time.Second):
						t.Fatal("no sweep within 30s")
					}
				}
				if err := b.wantState(held, proto.StateRetrying); err != nil {
					t.Error(err)
				}
				if n := b.messagesFor(held.ID); n != 0 {
					t.Errorf("%d alerts for the running job, want 0", n)
				}
				// Once the running job is acked, the lost one is found.
				if err := msgs[1].DoubleAck(b.ctx()); err != nil {
					t.Fatal(err)
				}
				b.waitFailed(lost)
				b.settled(30 * time.Second)
			}
			if n := b.messagesFor(lost.ID); n != 1 {
				t.Errorf("%d alerts for the job, want 1", n)
			}
			if n := b.streamMsgs(proto.StreamDLQ); n != 1 {
				t.Errorf("JOBS_DLQ holds %d jobs, want 1", n)
			}
			if !b.logged("job's deliveries used up, and no advisory said so") {
				t.Error("the sweep's find was not logged")
			}
		})
	}
}

// deliver fetches n jobs as a runner would.
func (b *bundle) deliver(n int) []jetstream.Msg {
	b.t.Helper()
	var msgs []jetstream.Msg
	natstest.CheckFor(b.t, 30*time.Second, time.Millisecond, func() error {
		batch, err := b.runner.Fetch(n-len(msgs), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if len(msgs) < n {
			return fmt.Errorf("%d jobs delivered, want %d", len(msgs), n)
		}
		return nil
	})
	return msgs
}

// waitFailed waits until job's record is failed.
func (b *bundle) waitFailed(job *proto.Job) {
	b.t.Helper()
	natstest.CheckFor(b.t, 30*time.Second, 20*time.Millisecond, func() error {
		return b.wantState(job, proto.StateFailed)
	})
}

// wantState says how job's status record differs from state.
func (b *bundle) wantState(job *proto.Job, state proto.State) error {
	st, _, err := b.status.Get(b.ctx(), job.ID)
	if err != nil {
		return err
	}
	if st.State != state {
		return fmt.Errorf("job %s is %s, want %s", job.ID, st.State, state)
	}
	return nil
}
