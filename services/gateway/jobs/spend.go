package jobs

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
)

// ProjectSpend is what a project with a budget spent today and this
// month, in the budget's calendar (loc), against its budget.
type ProjectSpend struct {
	Key        string  `json:"key"`
	DayUSD     float64 `json:"day_usd"`
	DailyUSD   float64 `json:"daily_usd,omitempty"`
	MonthUSD   float64 `json:"month_usd"`
	MonthlyUSD float64 `json:"monthly_usd,omitempty"`
	// DayResets and MonthResets are when the windows end.
	DayResets   time.Time `json:"day_resets"`
	MonthResets time.Time `json:"month_resets"`
}

// UsagePause is a credential paused at its usage limit, until Until.
type UsagePause struct {
	Credential string `json:"credential"`
	proto.Pause
}

// Spend returns the spend of every project of the registry that has a
// budget, in its order; none while NATS is away (best effort, like the
// other figures).
func (s *Service) Spend(ctx context.Context) []ProjectSpend {
	c := s.conn.Load()
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, proto.BucketSpend)
	if err != nil {
		return nil
	}
	loc := s.cfg.BudgetLoc
	if loc == nil {
		loc = time.UTC
	}
	now := s.cfg.Now()
	read := func(key string) float64 {
		e, err := kv.Get(ctx, key)
		if err != nil {
			return 0
		}
		sp, err := proto.DecodeSpend(e.Value())
		if err != nil {
			return 0
		}
		return sp.USD
	}
	var out []ProjectSpend
	for _, p := range s.cfg.Registry().Projects() {
		if p.Budget == nil {
			continue
		}
		out = append(out, ProjectSpend{
			Key:    p.Key,
			DayUSD: read(proto.SpendKey(p.Key, proto.WindowDay, now, loc)), DailyUSD: p.Budget.DailyUSD,
			MonthUSD: read(proto.SpendKey(p.Key, proto.WindowMonth, now, loc)), MonthlyUSD: p.Budget.MonthlyUSD,
			DayResets: proto.WindowEnd(proto.WindowDay, now, loc), MonthResets: proto.WindowEnd(proto.WindowMonth, now, loc),
		})
	}
	return out
}

// UsagePauses returns the usage-limit pauses in force, soonest reset
// first; none while NATS is away.
func (s *Service) UsagePauses(ctx context.Context) []UsagePause {
	kv, err := s.pausesBucket(ctx)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	w, err := kv.WatchFiltered(ctx, []string{proto.PauseUsagePrefix + ">"}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil
	}
	defer func() { _ = w.Stop() }()
	now := s.cfg.Now()
	var out []UsagePause
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				slices.SortFunc(out, func(a, b UsagePause) int { return a.Until.Compare(b.Until) })
				return out
			}
			if pz, err := proto.DecodePause(e.Value()); err == nil && pz.Active(now) {
				out = append(out, UsagePause{Credential: strings.TrimPrefix(e.Key(), proto.PauseUsagePrefix), Pause: *pz})
			}
		case <-ctx.Done():
			return out
		}
	}
}
