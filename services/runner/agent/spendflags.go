package agent

import (
	"slices"
	"strconv"
	"strings"
)

// WithSpendLimits adds Claude Code's own limits to its argv: maxUSD as
// --max-budget-usd (0: none) and maxTurns as --max-turns (0: none),
// unless the command sets them already. orch checks both itself too; the
// flags make Claude Code stop cleanly, with its result, before orch has
// to stop it.
func WithSpendLimits(argv []string, maxUSD float64, maxTurns int) []string {
	out := slices.Clone(argv)
	has := func(name string) bool {
		return slices.ContainsFunc(argv[1:], func(a string) bool { return a == name || strings.HasPrefix(a, name+"=") })
	}
	if maxUSD > 0 && !has("--max-budget-usd") {
		out = append(out, "--max-budget-usd", strconv.FormatFloat(maxUSD, 'f', -1, 64))
	}
	if maxTurns > 0 && !has("--max-turns") {
		out = append(out, "--max-turns", strconv.Itoa(maxTurns))
	}
	return out
}

// ClaudeMaxBudgetSubtype is the subtype of Claude Code's result when it
// stopped at its --max-budget-usd (checked with Claude Code 2.1.197
// against a stand-in API).
const ClaudeMaxBudgetSubtype = "error_max_budget_usd"

// ClaudeMaxTurnsSubtype is the subtype of Claude Code's result when it
// stopped at its --max-turns (checked with Claude Code 2.1.197).
const ClaudeMaxTurnsSubtype = "error_max_turns"
