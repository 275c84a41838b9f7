package agent

import (
	"os"
	"strings"
	"testing"
	"time"
)

// A usage limit is read from the rate_limit_event's resetsAt, else from
// the result's "resets <time of day>", else said without a time; a
// per-minute 429 or an allowed rate limit is none.
func TestParseUsageLimit(t *testing.T) {
	now := time.Date(2025, 12, 1, 10, 0, 0, 0, time.UTC)
	f, err := os.Open("testdata/usage-limit.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u, err := ParseUsageLimit(f, now)
	if err != nil {
		t.Fatal(err)
	}
	if !u.Hit || !u.ResetsAt.Equal(time.Unix(1764601200, 0)) {
		t.Errorf("transcript: %+v, want hit, resets at 1764601200", u)
	}
	for _, tc := range []struct {
		line string
		hit  bool
		at   time.Time
	}{
		{`{"type":"result","is_error":true,"result":"You've hit your limit · resets 3pm (Europe/Berlin)"}`, true, time.Date(2025, 12, 1, 14, 0, 0, 0, time.UTC)},
		{`{"type":"result","is_error":true,"result":"5-hour limit reached ∙ resets 9:30am (UTC)"}`, true, time.Date(2025, 12, 2, 9, 30, 0, 0, time.UTC)},
		{`{"type":"result","is_error":true,"result":"Claude AI usage limit reached|1764604800"}`, true, time.Unix(1764604800, 0)},
		{`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected"}}`, true, time.Time{}},
		{`{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1764604800}}`, false, time.Time{}},
		{`{"type":"result","is_error":true,"result":"API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit"}`, false, time.Time{}},
	} {
		u, err := ParseUsageLimit(strings.NewReader(tc.line+"\n"), now)
		if err != nil {
			t.Fatal(err)
		}
		if u.Hit != tc.hit || !u.ResetsAt.Equal(tc.at) {
			t.Errorf("%s: %+v, want hit %v at %v", tc.line, u, tc.hit, tc.at)
		}
	}
	data, _ := os.ReadFile("testdata/api-error-429-2.1.197.jsonl")
	if u, _ := ParseUsageLimit(strings.NewReader(string(data)), now); u.Hit {
		t.Errorf("Claude Code's per-minute 429 read as a usage limit: %+v", u)
	}
}
