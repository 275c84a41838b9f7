package main

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/stats"
)

func (b *bench) intakeDeliveries() ([]gitea.Delivery, []int, error) {
	ds := make([]gitea.Delivery, b.o.intakeN)
	ns := make([]int, b.o.intakeN)
	for i := range ds {
		var err error
		if ds[i], ns[i], err = delivery(); err != nil {
			return nil, nil, err
		}
	}
	return ds, ns, nil
}

// rawIntake publishes the intake bodies synchronously through js, each
// with a dedupe id, intakeC at once: the least an intake must do.
func (b *bench) rawIntake(ctx context.Context, js jetstream.JetStream) (stats.Sample, float64, error) {
	if _, err := rawStream(ctx, js, "BENCH_INTAKE", "bench.intake.>"); err != nil {
		return nil, 0, err
	}
	return b.timedIntake(func(d gitea.Delivery, n int) error {
		_, err := js.Publish(ctx, "bench.intake.widgets.review", d.Body, jetstream.WithMsgID("intake-"+strconv.Itoa(n)))
		return err
	})
}

// intake posts the intake webhooks to the gateway at base, intakeC at
// once.
func (b *bench) intake(ctx context.Context, base string) (stats.Sample, float64, error) {
	return b.timedIntake(func(d gitea.Delivery, n int) error {
		_, err := b.sendTo(ctx, base, d, n)
		return err
	})
}

// timedIntake hands each intake delivery (and its pull request number) to
// send, intakeC at once, and returns how long each send took and the
// deliveries per second over the whole run.
func (b *bench) timedIntake(send func(d gitea.Delivery, n int) error) (stats.Sample, float64, error) {
	ds, ns, err := b.intakeDeliveries()
	if err != nil {
		return nil, 0, err
	}
	lat := make(stats.Sample, len(ds))
	start := time.Now()
	err = pool(len(ds), b.o.intakeC, func(i int) error {
		t0 := time.Now()
		err := send(ds[i], ns[i])
		lat[i] = time.Since(t0)
		return err
	})
	return lat, float64(len(ds)) / time.Since(start).Seconds(), err
}
