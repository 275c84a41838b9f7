package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/orch-dev/orch/proto"
)

// tracker is what settle knows of the soak's jobs: those not ended yet,
// and the state each ended one ended in.
type tracker struct {
	open  map[string]bool
	ended map[string]proto.State
}

func newTracker() *tracker {
	return &tracker{open: map[string]bool{}, ended: map[string]proto.State{}}
}

func (tr *tracker) add(jobs []job) {
	for _, j := range jobs {
		tr.open[j.id] = true
	}
}

// counts is the jobs ended per state, as the status bucket holds them.
func (tr *tracker) counts() map[string]int {
	c := map[string]int{}
	for _, st := range tr.ended {
		c[string(st)]++
	}
	return c
}

// settle waits until every tracked job has ended (and every failed one is
// alerted), JOBS is empty and no advisory is pending, or timeout passes.
func (s *system) settle(ctx context.Context, tr *tracker, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = s.settled(ctx, tr); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (s *system) settled(ctx context.Context, tr *tracker) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var example string
	for id := range tr.open {
		st, err := s.status(ctx, id)
		if err == nil && st.State.Terminal() && (st.State != proto.StateFailed || st.Alerted) {
			delete(tr.open, id)
			tr.ended[id] = st.State
			continue
		}
		if example == "" {
			example = id
			if st != nil {
				example += " is " + string(st.State)
			}
		}
	}
	if len(tr.open) > 0 {
		return fmt.Errorf("%d jobs not ended, e.g. %s", len(tr.open), example)
	}
	stream, err := s.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs > 0 {
		return fmt.Errorf("JOBS holds %d messages", info.State.Msgs)
	}
	ci, err := s.consumerInfo(ctx, proto.StreamAdvisories, proto.ConsumerNotifier)
	if err != nil {
		return err
	}
	if ci.NumPending+uint64(ci.NumAckPending) > 0 {
		return fmt.Errorf("%d advisories pending", ci.NumPending+uint64(ci.NumAckPending))
	}
	return nil
}

// queueAgrees polls GET /queue until its done and failed counts agree
// with the status bucket's (tr's ended jobs), for up to queueLagLimit and
// then a few seconds more, and returns its last counts and how long
// agreement took (-1: never).
func (s *system) queueAgrees(tr *tracker) (map[string]int, time.Duration) {
	want := tr.counts()
	start := time.Now()
	for {
		q := s.queueCounts()
		if q != nil && q["done"] == want["done"] && q["failed"] == want["failed"] {
			return q, time.Since(start)
		}
		if time.Since(start) > s.queueLagLimit()+5*time.Second {
			return q, -1
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queueLagLimit is how soon GET /queue must agree with the status bucket
// once the system is quiet. On one server, 10 s (see below). On a cluster the
// gateway's watch of the bucket is an R1 ordered consumer on one server:
// when that server is lost (the last kill may come just before the end)
// nats.go makes a new one after two missed idle heartbeats of 5 s, so the
// index may be that far behind.
func (s *system) queueLagLimit() time.Duration {
	if s.cluster != nil {
		return 12 * time.Second
	}
	// One server restarted under chaos: the gateway starts its watch of
	// KV jobs again at the reconnect (agreed 6 ms after the end in a run;
	// before that, nats.go's remake of the watch took up to 10.4 s on a
	// loaded CI machine). The bound leaves room for a JetStream slow to
	// come back on such a machine.
	return 10 * time.Second
}
