package runner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/orch-dev/orch/services/runner/logstream"
)

// ORCH_MODEL_PRICES_FILE adds a model and changes a price; the built-in
// table stays for the rest, and a negative price is refused.
func TestLoadPrices(t *testing.T) {
	path := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(path, []byte(`{"Claude-New-1": {"input": 1, "output": 10}, "claude-opus-4-8": {"output": 50}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	prices, err := loadPrices(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{prices: prices}
	if got := r.price("claude-new-1-20261201", logstream.Usage{OutputTokens: 1e6}); got != 10 {
		t.Errorf("new model: %v, want 10", got)
	}
	if got := r.price("claude-opus-4-8", logstream.Usage{OutputTokens: 1e6}); got != 50 {
		t.Errorf("changed price: %v, want 50", got)
	}
	if got := r.price("claude-haiku-4-5", logstream.Usage{OutputTokens: 1e6}); got != 5 {
		t.Errorf("built-in price: %v, want 5", got)
	}
	if err := os.WriteFile(path, []byte(`{"m": {"input": -1}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadPrices(path); err == nil {
		t.Error("a negative price was taken")
	}
}
