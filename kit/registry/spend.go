package registry

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Budget is a project's spend limit per calendar window (registry key
// budget: {daily_usd, monthly_usd}): once a window's spend reaches it, a
// new job of the project is held (reason over_budget) until the window
// rolls over or the budget is raised. Zero in a window is no limit.
type Budget struct {
	DailyUSD   float64 `yaml:"daily_usd"`
	MonthlyUSD float64 `yaml:"monthly_usd"`
}

// Limit is the budget of window ("day" or "month"); 0 is none.
func (b *Budget) Limit(window string) float64 {
	if b == nil {
		return 0
	}
	if window == "month" {
		return b.MonthlyUSD
	}
	return b.DailyUSD
}

// CostCap is one job's spend limit (registry key max_cost_usd): a number
// for every kind, or a map of kind to number. Past it the agent is
// stopped and the job fails for good with reason over_budget.
type CostCap struct {
	// All is the cap of every kind without its own; 0 is none.
	All float64
	// ByKind are the kinds' own caps.
	ByKind map[string]float64
}

// UnmarshalYAML takes a number or a map by kind.
func (c *CostCap) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return n.Decode(&c.All)
	}
	return n.Decode(&c.ByKind)
}

// For is the cap of kind; 0 is none.
func (c CostCap) For(kind string) float64 {
	if v, ok := c.ByKind[kind]; ok {
		return v
	}
	return c.All
}

// The values of Project.Supersede.
const (
	// SupersedeQueued: a newer job of a task and kind cancels the older
	// ones still queued (the default).
	SupersedeQueued = "queued"
	// SupersedeRunning: it stops a running one too.
	SupersedeRunning = "running"
)

// checkSpend checks the spend keys: no negative limit, a known supersede.
func (p *Project) checkSpend() error {
	if b := p.Budget; b != nil && (b.DailyUSD < 0 || b.MonthlyUSD < 0) {
		return fmt.Errorf("project %q: budget: want amounts of 0 (no limit) or more", p.Key)
	}
	if p.MaxCostUSD.All < 0 {
		return fmt.Errorf("project %q: max_cost_usd: want 0 (no limit) or more", p.Key)
	}
	for kind, v := range p.MaxCostUSD.ByKind {
		if v < 0 {
			return fmt.Errorf("project %q: max_cost_usd %s: want 0 (no limit) or more", p.Key, kind)
		}
	}
	if p.MaxTurns < 0 {
		return fmt.Errorf("project %q: max_turns: want 0 (no limit) or more", p.Key)
	}
	switch p.Supersede {
	case "", SupersedeQueued, SupersedeRunning:
	default:
		return fmt.Errorf("project %q: supersede %q: want queued or running", p.Key, p.Supersede)
	}
	return nil
}
