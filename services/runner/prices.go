package runner

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strings"

	"github.com/orch-dev/orch/services/runner/egress"
	"github.com/orch-dev/orch/services/runner/logstream"
)

// filePrice is one model's entry of ORCH_MODEL_PRICES_FILE, in US dollars
// per million tokens.
type filePrice struct {
	Input        float64 `json:"input"`
	Output       float64 `json:"output"`
	CacheWrite5m float64 `json:"cache_write_5m"`
	CacheWrite1h float64 `json:"cache_write_1h"`
	CacheRead    float64 `json:"cache_read"`
}

// loadPrices is the price table the runner meters spend by: the egress
// proxy's DefaultPrices with the models of the JSON file at path (none:
// "") laid over them, keyed by model id without its date suffix:
//
//	{"claude-opus-5-5": {"input": 5, "output": 25, "cache_write_5m": 6.25, "cache_write_1h": 10, "cache_read": 0.5}}
func loadPrices(path string) (map[string]egress.Price, error) {
	prices := maps.Clone(egress.DefaultPrices)
	if path == "" {
		return prices, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ORCH_MODEL_PRICES_FILE: %w", err)
	}
	var file map[string]filePrice
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("ORCH_MODEL_PRICES_FILE %s: %w", path, err)
	}
	for model, p := range file {
		if p.Input < 0 || p.Output < 0 || p.CacheWrite5m < 0 || p.CacheWrite1h < 0 || p.CacheRead < 0 {
			return nil, fmt.Errorf("ORCH_MODEL_PRICES_FILE %s: %s: a price below 0", path, model)
		}
		prices[strings.ToLower(strings.TrimSpace(model))] = egress.Price{Input: p.Input, Output: p.Output,
			CacheWrite5m: p.CacheWrite5m, CacheWrite1h: p.CacheWrite1h, CacheRead: p.CacheRead}
	}
	return prices, nil
}

// price prices one assistant message's usage by the runner's table; a
// model the table does not name costs nothing here (the egress proxy
// counts it as unpriced).
func (r *Runner) price(model string, u logstream.Usage) float64 {
	c, _ := egress.Cost(r.prices, model, u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens, u.OutputTokens)
	return c
}
