package agent

import (
	"slices"
	"testing"
)

// Claude Code gets --max-budget-usd and --max-turns where there is a
// limit, and a command that sets them keeps its own.
func TestWithSpendLimits(t *testing.T) {
	for _, tc := range []struct {
		argv  []string
		usd   float64
		turns int
		want  []string
	}{
		{[]string{"claude", "-p"}, 0.4, 12, []string{"claude", "-p", "--max-budget-usd", "0.4", "--max-turns", "12"}},
		{[]string{"claude", "-p"}, 0, 0, []string{"claude", "-p"}},
		{[]string{"claude", "--max-turns=3"}, 1.25, 9, []string{"claude", "--max-turns=3", "--max-budget-usd", "1.25"}},
	} {
		if got := WithSpendLimits(tc.argv, tc.usd, tc.turns); !slices.Equal(got, tc.want) {
			t.Errorf("WithSpendLimits(%v, %v, %d) = %v, want %v", tc.argv, tc.usd, tc.turns, got, tc.want)
		}
	}
}
