package runner

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// The releaser. Every runner runs one: it watches the status bucket for
// held records (so, after a restart, it finds every job held while it was
// away) and, every releaseInterval and at once after a registry reload,
// asks holdFor of each whether it may start now. One that may is
// published again, oldest first, by status.ReleaseHeld: the hold's own
// message id makes two runners releasing the same job publish one
// message, and the record's compare-and-set records the release once. So
// a hold ends by itself when its window rolls over, its budget is raised
// (SIGHUP), its usage pause passes its reset or an operator lifts a
// project's pause; POST /jobs/{id}/release ends one by hand.

// releaseInterval is how often held jobs are looked at: a usage limit's
// reset or a window's end is acted on within it.
const releaseInterval = time.Second

// releaser watches the held jobs until ctx ends; poke makes it look at
// them at once.
func (r *Runner) releaser(ctx context.Context, poke <-chan struct{}) {
	log := r.log.Named("releaser")
	for ctx.Err() == nil {
		if err := r.watchHeld(ctx, log, poke); err != nil && ctx.Err() == nil {
			log.Warn("watching held jobs; watching again", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(releaseInterval):
			}
		}
	}
}

// watchHeld is one watch of the status bucket: it keeps the held records
// and releases those whose hold ended, until ctx ends or the watch does.
func (r *Runner) watchHeld(ctx context.Context, log *zap.Logger, poke <-chan struct{}) error {
	w, err := r.jobsKV.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	wp, err := r.pauses.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = wp.Stop() }()
	held := map[string]*proto.Status{}
	pauses := map[string]*proto.Pause{}
	tick := time.NewTicker(releaseInterval)
	defer tick.Stop()
	budgets := time.NewTicker(budgetGaugeInterval)
	defer budgets.Stop()
	r.gaugeBudgets(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-budgets.C:
			r.gaugeBudgets(ctx)
			continue
		case e, ok := <-wp.Updates():
			if !ok {
				return errors.New("pauses watch ended")
			}
			if e == nil {
				continue
			}
			if pz, err := proto.DecodePause(e.Value()); err == nil && e.Operation() == jetstream.KeyValuePut {
				pauses[e.Key()] = pz
				r.gaugePauses(pauses)
				continue
			}
			// A pause lifted: its jobs may run now.
			delete(pauses, e.Key())
			r.gaugePauses(pauses)
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if e == nil {
				continue // the current records are in
			}
			if e.Operation() != jetstream.KeyValuePut {
				delete(held, e.Key())
				continue
			}
			st, err := proto.DecodeStatus(e.Value())
			if err != nil || st.State != proto.StateHeld {
				delete(held, e.Key())
				continue
			}
			held[e.Key()] = st
			continue
		case <-poke:
		case <-tick.C:
		}
		r.gaugePauses(pauses)
		r.releaseEnded(ctx, log, held)
		r.gaugeHeld(held)
	}
}

// budgetGaugeInterval is how often orch_budget_remaining_usd is read
// from the spend bucket.
const budgetGaugeInterval = 15 * time.Second

// gaugeHeld sets orch_jobs_held from the held records: every runner
// serves the fleet's figure (take max across runners).
func (r *Runner) gaugeHeld(held map[string]*proto.Status) {
	n := map[string]int{}
	for _, st := range held {
		n[st.HeldReason]++
	}
	for _, reason := range proto.HoldReasons {
		r.metrics.held.WithLabelValues(reason).Set(float64(n[reason]))
	}
}

// gaugePauses sets orch_pause_active: the pauses in force now.
func (r *Runner) gaugePauses(pauses map[string]*proto.Pause) {
	n, now := 0, time.Now()
	for _, pz := range pauses {
		if pz.Active(now) {
			n++
		}
	}
	r.metrics.pauses.Set(float64(n))
}

// gaugeBudgets sets orch_budget_usd and orch_budget_remaining_usd of
// every project, per window: a window without a budget is 0 and +Inf (no
// limit).
func (r *Runner) gaugeBudgets(ctx context.Context) {
	now := time.Now()
	for _, p := range r.projects.Load().reg.Projects() {
		for _, w := range proto.Windows {
			limit := p.Budget.Limit(w)
			r.metrics.budget.WithLabelValues(p.Key, w).Set(limit)
			if limit <= 0 {
				r.metrics.remaining.WithLabelValues(p.Key, w).Set(math.Inf(1))
				continue
			}
			if spent, err := r.spent(ctx, p.Key, w, now); err == nil {
				r.metrics.remaining.WithLabelValues(p.Key, w).Set(limit - spent)
			}
		}
	}
}

// releaseEnded publishes again, oldest first, each job of held whose hold
// has ended.
func (r *Runner) releaseEnded(ctx context.Context, log *zap.Logger, held map[string]*proto.Status) {
	if len(held) == 0 {
		return
	}
	sts := make([]*proto.Status, 0, len(held))
	for _, st := range held {
		sts = append(sts, st)
	}
	slices.SortFunc(sts, func(a, b *proto.Status) int {
		if c := a.Job.CreatedAt.Compare(b.Job.CreatedAt); c != 0 {
			return c
		}
		return a.HeldAt.Compare(b.HeldAt)
	})
	reg := r.projects.Load().reg
	// A project's holds are the same for each of its jobs at one look.
	holds := map[string]string{}
	publish := status.PublishTo(r.js)
	for _, st := range sts {
		job := &st.Job
		jl := log.With(zap.String("job", job.ID), zap.String("project", job.Project))
		reason, seen := holds[job.Project]
		if !seen {
			if p, ok := reg.ByKey(job.Project); ok {
				reason, _ = r.holdFor(ctx, jl, job, p)
			}
			// A project the registry no longer has is released: the
			// runner that pulls it rejects it, as any job of it.
			holds[job.Project] = reason
		}
		if reason != "" {
			continue
		}
		_, err := r.status.ReleaseHeld(ctx, job.ID, "", publish)
		switch {
		case errors.Is(err, status.ErrNotHeld), errors.Is(err, status.ErrNotFound):
		case err != nil:
			jl.Warn("releasing held job", zap.Error(err))
			continue
		default:
			jl.Info("hold ended: job queued again", zap.String("was_held", st.HeldReason))
		}
		delete(held, job.ID)
	}
}
