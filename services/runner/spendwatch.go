package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/orch-dev/orch/services/runner/logstream"
)

// spendWatchInterval is how often a running agent's spend is compared
// with its cap: it is stopped within about this long of the output line
// that passed it.
const spendWatchInterval = 100 * time.Millisecond

// watchSpend stops the agent with errOverBudget, through stop, once the
// output pub follows shows it spent more than capUSD (0: no cap): its
// assistant messages' usage priced by the price table, the cost it
// reported, or its egress proxy's meter (metered); and with errMaxTurns once it shows more turns than maxTurns
// (0: no limit), the turns orch counts (assistant messages). It returns
// when ctx ends or it stopped the agent.
func watchSpend(ctx context.Context, pub *logstream.Publisher, metered func() float64, capUSD float64, maxTurns int, stop context.CancelCauseFunc) {
	if capUSD <= 0 && maxTurns <= 0 {
		return
	}
	t := time.NewTicker(spendWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		prog, _ := pub.Progress()
		if spent := max(prog.SpentUSD, metered()); capUSD > 0 && spent > capUSD {
			stop(fmt.Errorf("%w: the agent spent %s, past the job's cap of %s (max_cost_usd)",
				errOverBudget, usd(spent), usd(capUSD)))
			return
		}
		if maxTurns > 0 && prog.Turns > maxTurns {
			stop(fmt.Errorf("%w: the agent took %d turns, past max_turns %d", errMaxTurns, prog.Turns, maxTurns))
			return
		}
	}
}

// usd shows an amount in dollars: to the cent, or to four places below
// one.
func usd(v float64) string {
	if v != 0 && v < 0.01 {
		return fmt.Sprintf("$%.4f", v)
	}
	return fmt.Sprintf("$%.2f", v)
}
