// Package stats summarises latency samples.
package stats

import (
	"fmt"
	"slices"
	"time"
)

// Sample is a set of latencies.
type Sample []time.Duration

// Quantile returns the q-quantile (0..1) by the nearest-rank method, 0 for
// an empty sample.
func (s Sample) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(q*float64(len(c))+0.5) - 1
	return c[min(max(i, 0), len(c)-1)]
}

// P50 is the median.
func (s Sample) P50() time.Duration { return s.Quantile(0.50) }

// P99 is the 99th percentile.
func (s Sample) P99() time.Duration { return s.Quantile(0.99) }

// Ms formats d in milliseconds with two decimals.
func Ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
