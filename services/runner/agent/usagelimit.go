package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// UsageLimit is what an agent's output says of its account's usage limit.
type UsageLimit struct {
	// Hit says the account's limit was met: Claude Code printed a
	// rate_limit_event whose status is "rejected", or a result saying
	// "You've hit your limit · resets 3pm" (older versions: "Claude AI
	// usage limit reached|<unix time>").
	Hit bool
	// ResetsAt is when the limit resets, where the output said; zero
	// when it did not.
	ResetsAt time.Time
}

// rateLimitEvent is Claude Code's rate_limit_event; its fields are in
// rate_limit_info (and, in some versions, on the event itself).
type rateLimitEvent struct {
	Type          string         `json:"type"`
	RateLimitInfo *rateLimitInfo `json:"rate_limit_info"`
	rateLimitInfo
	// Result and IsError are a result event's.
	Result  string `json:"result"`
	IsError bool   `json:"is_error"`
}

type rateLimitInfo struct {
	Status   string          `json:"status"`
	ResetsAt json.RawMessage `json:"resetsAt"`
}

var (
	// limitText is the result text of a met limit: "You've hit your limit
	// · resets 3pm (Europe/Berlin)", "5-hour limit reached ∙ resets 3:30pm".
	limitText = regexp.MustCompile(`(?i)(hit your (usage )?limit|limit reached)[^\n]*?resets\s+(\d{1,2})(?::(\d{2}))?\s*(am|pm)?(?:\s*\(([A-Za-z_]+(?:/[A-Za-z_+-]+)*)\))?`)
	// legacyLimit is older versions' "Claude AI usage limit reached|<unix>".
	legacyLimit = regexp.MustCompile(`usage limit reached\|(\d{9,13})`)
)

// ParseUsageLimit reads an agent's stream-json output for a met usage
// limit; now places a reset given as a time of day (the next such time).
func ParseUsageLimit(r io.Reader, now time.Time) (UsageLimit, error) {
	var out UsageLimit
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '{' && bytes.Contains(t, []byte("limit")) {
			var ev rateLimitEvent
			if json.Unmarshal(t, &ev) == nil {
				out = ev.merge(out, now)
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// ParseUsageLimitFile is ParseUsageLimit on the file at path.
func ParseUsageLimitFile(path string, now time.Time) (UsageLimit, error) {
	f, err := os.Open(path)
	if err != nil {
		return UsageLimit{}, err
	}
	defer f.Close()
	return ParseUsageLimit(f, now)
}

// merge adds what ev says to u.
func (ev *rateLimitEvent) merge(u UsageLimit, now time.Time) UsageLimit {
	switch ev.Type {
	case "rate_limit_event":
		info := ev.RateLimitInfo
		if info == nil {
			info = &ev.rateLimitInfo
		}
		if info.Status != "rejected" {
			return u
		}
		u.Hit = true
		if at := unixTime(info.ResetsAt); !at.IsZero() {
			u.ResetsAt = at
		}
	case "result":
		if m := legacyLimit.FindStringSubmatch(ev.Result); m != nil {
			u.Hit = true
			u.ResetsAt = unixTime(json.RawMessage(m[1]))
		} else if m := limitText.FindStringSubmatch(ev.Result); m != nil {
			u.Hit = true
			if at := timeOfDay(m[3], m[4], m[5], m[6], now); !at.IsZero() && u.ResetsAt.IsZero() {
				u.ResetsAt = at
			}
		}
	}
	return u
}

// unixTime reads a resetsAt: Unix seconds (or milliseconds), as a number
// or a string, or an RFC 3339 time.
func unixTime(raw json.RawMessage) time.Time {
	s := strings.Trim(string(raw), `"`)
	if s == "" || s == "null" {
		return time.Time{}
	}
	if n, err := strconv.ParseFloat(s, 64); err == nil && n > 0 {
		if n > 1e12 {
			return time.UnixMilli(int64(n)).UTC()
		}
		return time.Unix(int64(n), 0).UTC()
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC()
	}
	return time.Time{}
}

// timeOfDay is the next time after now that is hour[:minute][am|pm] in
// zone (the runner's local time when empty or unknown).
func timeOfDay(hour, minute, ampm, zone string, now time.Time) time.Time {
	h, err := strconv.Atoi(hour)
	if err != nil {
		return time.Time{}
	}
	m, _ := strconv.Atoi(minute)
	switch strings.ToLower(ampm) {
	case "pm":
		if h < 12 {
			h += 12
		}
	case "am":
		if h == 12 {
			h = 0
		}
	}
	if h > 23 || m > 59 {
		return time.Time{}
	}
	loc := time.Local
	if zone != "" {
		if l, err := time.LoadLocation(zone); err == nil {
			loc = l
		}
	}
	n := now.In(loc)
	at := time.Date(n.Year(), n.Month(), n.Day(), h, m, 0, 0, loc)
	if !at.After(now) {
		at = at.AddDate(0, 0, 1)
	}
	return at.UTC()
}
