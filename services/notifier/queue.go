package notifier

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/orch-dev/orch/proto"
)

// The queue figures are served by the notifier alone. They are JetStream's
// figures, the same whoever asks, so a service with several replicas (the
// gateway, the runners) would report each one once per replica, and a sum
// over them would count it twice. The notifier runs as one replica (its
// consumer hands out one advisory at a time, so more add nothing); should
// two run, the shipped rules take the max over instances.
var (
	queuePendingDesc = prometheus.NewDesc("orch_notifier_queue_pending_jobs",
		"Jobs in "+proto.StreamJobs+" no runner has taken yet (the runner consumer's pending count).", nil, nil)
	queueAckPendingDesc = prometheus.NewDesc("orch_notifier_queue_ack_pending_jobs",
		"Jobs delivered to a runner and not settled yet: running, or waiting out a retry delay.", nil, nil)
	queueRedeliveredDesc = prometheus.NewDesc("orch_notifier_queue_redelivered_jobs",
		"Unsettled jobs delivered more than once (retries, jobs taken over from a lost runner).", nil, nil)
	queueOldestDesc = prometheus.NewDesc("orch_notifier_queue_oldest_pending_age_seconds",
		"Age of the oldest job no runner has taken yet; 0 when none waits.", nil, nil)
	advisoriesPendingDesc = prometheus.NewDesc("orch_notifier_advisories_pending",
		"Terminal-failure advisories in "+proto.StreamAdvisories+" not yet handled.", nil, nil)
)

// queueCollector reads the queue figures from JetStream at each scrape:
// two consumer infos and at most one message lookup, whatever the depth.
// A figure JetStream cannot give within the scrape is left out, not
// reported stale.
type queueCollector struct {
	jetStream func() jetstream.JetStream
}

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{queuePendingDesc, queueAckPendingDesc, queueRedeliveredDesc, queueOldestDesc, advisoriesPendingDesc} {
		ch <- d
	}
}

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	js := c.jetStream()
	if js == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	if s, err := js.Stream(ctx, proto.StreamJobs); err == nil {
		if cons, err := s.Consumer(ctx, proto.ConsumerRunner); err == nil {
			if info, err := cons.Info(ctx); err == nil {
				gauge(queuePendingDesc, float64(info.NumPending))
				gauge(queueAckPendingDesc, float64(info.NumAckPending))
				gauge(queueRedeliveredDesc, float64(info.NumRedelivered))
				if age, ok := oldestPending(ctx, s, info); ok {
					gauge(queueOldestDesc, age.Seconds())
				}
			}
		}
	}
	if cons, err := js.Consumer(ctx, proto.StreamAdvisories, proto.ConsumerNotifier); err == nil {
		if info, err := cons.Info(ctx); err == nil {
			gauge(advisoriesPendingDesc, float64(info.NumPending+uint64(info.NumAckPending)))
		}
	}
}

// oldestPending is the age of the first job past the last one delivered
// to a runner: the oldest that none has taken yet.
func oldestPending(ctx context.Context, s jetstream.Stream, info *jetstream.ConsumerInfo) (time.Duration, bool) {
	if info.NumPending == 0 {
		return 0, true
	}
	msg, err := s.GetMsg(ctx, info.Delivered.Stream+1, jetstream.WithGetMsgSubject(proto.SubjectJobsAll))
	if err != nil {
		return 0, false
	}
	return max(0, time.Since(msg.Time)), true
}
