package main

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/stats"
)

// --- intake ---

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

func (b *bench) rawIntake(ctx context.Context) (stats.Sample, float64, error) {
	if _, err := b.rawStream(ctx, "BENCH_INTAKE", "bench.intake.>"); err != nil {
		return nil, 0, err
	}
	ds, ns, err := b.intakeDeliveries()
	if err != nil {
		return nil, 0, err
	}
	lat := make(stats.Sample, len(ds))
	start := time.Now()
	err = pool(len(ds), b.o.intakeC, func(i int) error {
		t0 := time.Now()
		_, err := b.js.Publish(ctx, "bench.intake.widgets.review", ds[i].Body, jetstream.WithMsgID("intake-"+strconv.Itoa(ns[i])))
		lat[i] = time.Since(t0)
		return err
	})
	return lat, float64(len(ds)) / time.Since(start).Seconds(), err
}

func (b *bench) intake(ctx context.Context) (stats.Sample, float64, error) {
	ds, ns, err := b.intakeDeliveries()
	if err != nil {
		return nil, 0, err
	}
	lat := make(stats.Sample, len(ds))
	start := time.Now()
	err = pool(len(ds), b.o.intakeC, func(i int) error {
		t0 := time.Now()
		_, err := b.send(ctx, ds[i], ns[i])
		lat[i] = time.Since(t0)
		return err
	})
	return lat, float64(len(ds)) / time.Since(start).Seconds(), err
}
