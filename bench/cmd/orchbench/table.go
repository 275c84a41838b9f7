package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// row is one line of the table: orch's figure, the baseline's, their
// ratio, the target and whether it is met.
type row struct {
	what, orch, base, ratio, target, verdict string
}

type table struct{ rows []row }

func (t *table) add(r row) { t.rows = append(t.rows, r) }

// ratio adds a row whose verdict compares orch/base with a target bound:
// atLeast says whether the ratio must be at least (or at most) bound; a
// bound of 0 means no target (the row is reported, not judged).
func (t *table) ratio(what, orch, base string, r float64, atLeast bool, bound float64) {
	rw := row{what: what, orch: orch, base: base, ratio: fmt.Sprintf("%.2fx", r), target: "-", verdict: "-"}
	if bound > 0 {
		if atLeast {
			rw.target = fmt.Sprintf(">= %.1fx", bound)
			rw.verdict = verdict(r >= bound)
		} else {
			rw.target = fmt.Sprintf("<= %.1fx", bound)
			rw.verdict = verdict(r <= bound)
		}
	}
	t.add(rw)
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func (t *table) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measure\torch\tbaseline (same run)\tratio\ttarget\t")
	fmt.Fprintln(tw, "-------\t----\t-------------------\t-----\t------\t")
	for _, r := range t.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.what, r.orch, r.base, r.ratio, r.target, r.verdict)
	}
	_ = tw.Flush()
	var missed []string
	for _, r := range t.rows {
		if r.verdict == "MISS" {
			missed = append(missed, r.what)
		}
	}
	if len(missed) > 0 {
		fmt.Fprintf(w, "\nmissed: %s\n", strings.Join(missed, "; "))
	}
}

// deltaMs is d as a difference in milliseconds, signed: "+1.23 ms".
func deltaMs(d time.Duration) string {
	return fmt.Sprintf("%+.2f ms", float64(d)/float64(time.Millisecond))
}
