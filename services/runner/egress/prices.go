package egress

import (
	"regexp"
	"strings"
)

// Price is what a model's tokens cost, in US dollars per million tokens.
type Price struct {
	Input float64
	// CacheWrite5m and CacheWrite1h price prompt-cache writes with a five
	// minute and a one hour lifetime; a response that does not say which
	// is priced at CacheWrite5m.
	CacheWrite5m, CacheWrite1h float64
	CacheRead                  float64
	Output                     float64
}

// DefaultPrices prices the models Claude Code runs on, keyed by model id
// without its date suffix (claude-sonnet-4-5-20250929 is claude-sonnet-4-5).
// Source: Anthropic's pricing page,
// https://platform.claude.com/docs/en/about-claude/pricing, as read on
// 2026-12-01. Long-context surcharges (Sonnet 4 and 4.5 above 200K input
// tokens), batch discounts and data-residency multipliers are not applied:
// the figure is a meter for budgets, not the invoice. Models priced by
// prompt length (Haiku 5.5) or not yet read here (Opus 5.5, Fable) are
// missing: a model missing here is counted in Usage.Unpriced and adds no
// cost; Options.Prices replaces the table.
var DefaultPrices = map[string]Price{
	"claude-opus-5":   {Input: 5, CacheWrite5m: 6.25, CacheWrite1h: 10, CacheRead: 0.50, Output: 25},
	"claude-opus-4-8": {Input: 5, CacheWrite5m: 6.25, CacheWrite1h: 10, CacheRead: 0.50, Output: 25},
	"claude-opus-4-7": {Input: 5, CacheWrite5m: 6.25, CacheWrite1h: 10, CacheRead: 0.50, Output: 25},
	"claude-opus-4-6": {Input: 5, CacheWrite5m: 6.25, CacheWrite1h: 10, CacheRead: 0.50, Output: 25},
	"claude-opus-4-5": {Input: 5, CacheWrite5m: 6.25, CacheWrite1h: 10, CacheRead: 0.50, Output: 25},
	"claude-opus-4-1": {Input: 15, CacheWrite5m: 18.75, CacheWrite1h: 30, CacheRead: 1.50, Output: 75},
	"claude-opus-4":   {Input: 15, CacheWrite5m: 18.75, CacheWrite1h: 30, CacheRead: 1.50, Output: 75},
	// Sonnet 5.5's cache reads were cut from $0.20 to $0.10 on 2026-10-07.
	"claude-sonnet-5-5": {Input: 2, CacheWrite5m: 2.50, CacheWrite1h: 4, CacheRead: 0.10, Output: 10},
	"claude-sonnet-5":   {Input: 2, CacheWrite5m: 2.50, CacheWrite1h: 4, CacheRead: 0.20, Output: 10},
	"claude-sonnet-4-6": {Input: 3, CacheWrite5m: 3.75, CacheWrite1h: 6, CacheRead: 0.30, Output: 15},
	"claude-sonnet-4-5": {Input: 3, CacheWrite5m: 3.75, CacheWrite1h: 6, CacheRead: 0.30, Output: 15},
	"claude-sonnet-4":   {Input: 3, CacheWrite5m: 3.75, CacheWrite1h: 6, CacheRead: 0.30, Output: 15},
	"claude-haiku-4-5":  {Input: 1, CacheWrite5m: 1.25, CacheWrite1h: 2, CacheRead: 0.10, Output: 5},
}

var modelSuffix = regexp.MustCompile(`(-\d{8}|-latest|-0)$`)

// priceKey is a model id as DefaultPrices keys it: lowercased, without a
// date or "-latest" suffix, and claude-opus-4-0 as claude-opus-4.
func priceKey(model string) string {
	return modelSuffix.ReplaceAllString(strings.ToLower(strings.TrimSpace(model)), "")
}

// cost prices t by p.
func (p Price) cost(t tokens) float64 {
	write5m, write1h := t.cacheCreation, int64(0)
	if t.split {
		write5m, write1h = t.cache5m, t.cache1h
	}
	return (float64(t.input)*p.Input +
		float64(write5m)*p.CacheWrite5m +
		float64(write1h)*p.CacheWrite1h +
		float64(t.cacheRead)*p.CacheRead +
		float64(t.output)*p.Output) / 1e6
}

// Cost prices one answer's tokens by the model's price in prices
// (DefaultPrices when nil): cache writes at the five-minute price. ok is
// false for a model the table does not name.
func Cost(prices map[string]Price, model string, input, cacheWrite, cacheRead, output int64) (usd float64, ok bool) {
	if prices == nil {
		prices = DefaultPrices
	}
	p, ok := prices[priceKey(model)]
	if !ok {
		return 0, false
	}
	return p.cost(tokens{input: input, cacheCreation: cacheWrite, cacheRead: cacheRead, output: output}), true
}
