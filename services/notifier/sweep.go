package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
)

// sweepEvery is how often the notifier looks for jobs whose deliveries
// are used up without an advisory.
const sweepEvery = time.Minute

// sweepMax bounds the advisories one sweep stands in for.
const sweepMax = 100

// sweep stands in for MAX_DELIVERIES advisories that never reached
// JOBS_ADVISORIES, every interval until ctx ends. JetStream publishes that
// advisory once, as a plain message from the consumer's leader; published
// while the advisories stream changes leader (a cluster member lost), it
// is gone, and the job would stay in JOBS, shown running and never
// alerted (make soak-cluster found two in 5,000).
//
// A message whose deliveries are used up is no longer pending on the
// runner consumer, and a work queue removes the acked ones, so a message
// still in JOBS is used up when it is at or below the consumer's ack
// floor, or when it was delivered and nothing is pending. (nats-server
// 2.15 keeps the ack floor below a used-up message while a later one is
// pending, so on a busy queue the message is found once the queue goes
// quiet.) Each found is published to JOBS_ADVISORIES as the advisory
// JetStream would have sent, deduplicated by its sequence, and handled by
// the same loop as the real ones, one at a time: a job whose real
// advisory came too is found gone from JOBS and left alone. The sweep
// waits while the notifier's consumer has advisories to handle, so an
// outage of Telegram does not pile copies up behind it.
func (n *Notifier) sweep(ctx context.Context, every time.Duration, swept func(found int)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		op, cancel := context.WithTimeout(ctx, max(every, opTimeout))
		found, err := n.sweepOnce(op)
		cancel()
		if swept != nil && err == nil {
			swept(found)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			n.log.Warn("looking for jobs whose deliveries are used up", zap.Error(err))
		case found > 0:
			n.log.Info("jobs whose deliveries are used up without an advisory: handling each as one", zap.Int("jobs", found))
		}
	}
}

// sweepOnce publishes an advisory for each message of JOBS whose
// deliveries are used up, and returns how many it published.
func (n *Notifier) sweepOnce(ctx context.Context) (int, error) {
	adv, err := n.js.Consumer(ctx, proto.StreamAdvisories, proto.ConsumerNotifier)
	if err != nil {
		return 0, err
	}
	ai, err := adv.Info(ctx)
	if err != nil {
		return 0, err
	}
	if ai.NumPending > 0 || ai.NumAckPending > 0 {
		return 0, nil
	}
	stream, err := n.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return 0, err
	}
	cons, err := stream.Consumer(ctx, proto.ConsumerRunner)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, nil // no runner has started yet
	}
	if err != nil {
		return 0, err
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	floor := ci.AckFloor.Stream
	if ci.NumAckPending == 0 {
		// Nothing is running or waiting for a retry: whatever is left of
		// what was delivered is used up.
		floor = ci.Delivered.Stream
	}
	found := 0
	for seq := stream.CachedInfo().State.FirstSeq; seq <= floor && found < sweepMax; found++ {
		raw, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(proto.SubjectJobsAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return found, err
		}
		if raw.Sequence > floor {
			break
		}
		if err := n.publishExhausted(ctx, raw.Sequence, uint64(ci.Config.MaxDeliver)); err != nil {
			return found, err
		}
		n.log.Warn("job's deliveries used up, and no advisory said so", zap.Uint64("stream_seq", raw.Sequence), zap.String("subject", raw.Subject))
		seq = raw.Sequence + 1
	}
	return found, nil
}

// publishExhausted publishes the MAX_DELIVERIES advisory of the job at seq
// in JOBS, as JetStream sends it.
func (n *Notifier) publishExhausted(ctx context.Context, seq, deliveries uint64) error {
	id := "sweep-" + strconv.FormatUint(seq, 10)
	data, err := json.Marshal(proto.Advisory{
		Type: proto.AdvisoryMaxDeliveries, ID: id,
		Stream: proto.StreamJobs, Consumer: proto.ConsumerRunner,
		StreamSeq: seq, Deliveries: deliveries,
	})
	if err != nil {
		return err
	}
	m := nats.NewMsg(proto.SubjectRunnerMaxDeliveries)
	m.Data = data
	m.Header.Set(proto.HeaderMsgID, id)
	if _, err := n.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("publishing the advisory of %s seq %d: %w", proto.StreamJobs, seq, err)
	}
	return nil
}
