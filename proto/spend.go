package proto

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketSpend is the KV bucket of what each project spent per budget
// window, keyed "<project>.day.<YYYY-MM-DD>" and
// "<project>.month.<YYYY-MM>" (SpendKey), the calendar day and month in
// the budget's time zone (ORCH_BUDGET_TZ, UTC by default). The value is a
// Spend in JSON, changed only by compare-and-set so two runners never
// lose an increment.
const BucketSpend = "spend"

// The budget windows.
const (
	WindowDay   = "day"
	WindowMonth = "month"
)

// Windows lists the budget windows.
var Windows = []string{WindowDay, WindowMonth}

// SpendTTL is how long a window's sum is kept: past a month it is only
// history.
const SpendTTL = 62 * 24 * time.Hour

// WindowID names the window of kind (WindowDay, WindowMonth) that holds t
// in loc: "2026-12-01" or "2026-12".
func WindowID(window string, t time.Time, loc *time.Location) string {
	t = t.In(loc)
	if window == WindowMonth {
		return t.Format("2006-01")
	}
	return t.Format("2006-01-02")
}

// WindowEnd is when the window of kind that holds t in loc ends: the next
// midnight, or the first of the next month.
func WindowEnd(window string, t time.Time, loc *time.Location) time.Time {
	t = t.In(loc)
	y, m, d := t.Date()
	if window == WindowMonth {
		return time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return time.Date(y, m, d+1, 0, 0, 0, 0, loc)
}

// SpendKey is the key of project's spend in the window of kind holding t.
func SpendKey(project, window string, t time.Time, loc *time.Location) string {
	return project + "." + window + "." + WindowID(window, t, loc)
}

// Spend is the value of a key in BucketSpend.
type Spend struct {
	// USD is the window's sum: the cost of every attempt counted in it.
	USD float64 `json:"usd"`
	// Counted lists the latest attempts added ("<job id>/<attempt>"), so
	// that an increment applied again (its answer lost, a settle run
	// twice) is not added twice. It keeps the last SpendCountedMax.
	Counted []string `json:"counted,omitempty"`
	// UpdatedAt is when it last changed.
	UpdatedAt time.Time `json:"updated_at"`
}

// SpendCountedMax bounds Spend.Counted.
const SpendCountedMax = 256

// DecodeSpend parses a value of BucketSpend.
func DecodeSpend(data []byte) (*Spend, error) {
	var s Spend
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decoding spend: %w", err)
	}
	return &s, nil
}

// SpendBucket is the configuration of BucketSpend.
func (t Topology) SpendBucket() jetstream.KeyValueConfig {
	return t.bucket(BucketSpend, "orch spend per project and budget window", SpendTTL)
}
