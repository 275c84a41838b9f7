// Package alert renders one terminal failure into a Telegram message a
// person can act on from a phone.
package alert

import (
	"cmp"
	"fmt"
	"strings"
	"unicode/utf8"

	filetail "github.com/orch-dev/orch/kit/tail"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

// LogTailLines is how many lines of the agent's log an alert shows.
const LogTailLines = 15

// LogTailBytes bounds the part of the log an alert's tail is taken from.
const LogTailBytes = 8 << 10

// LastLines returns the last n lines of s.
func LastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Limits on single fields, so that one huge field cannot crowd out the
// others.
const (
	maxTitle  = 256
	maxReason = 512
	maxURL    = 2048
)

// CutMarker shows where text was cut to fit a message.
const CutMarker = "…[cut]"

// Failure is what is known of one job that failed for good.
type Failure struct {
	Status   *proto.Status
	Attempts int
	// Reason is why JetStream gave up: every attempt failed, or the Term
	// reason.
	Reason string
	// LogTail is the end of the agent's readable log.
	LogTail string
	// JobURL links to the job in the gateway, if ORCH_PUBLIC_URL is set.
	JobURL string
}

// Render returns the HTML message, at most telegram.MaxMessageLen long as
// Telegram counts: the title and reason are cut to a bound, then the error
// and the log tail share what is left, each cut with CutMarker.
func Render(f Failure) string {
	st, job := f.Status, &f.Status.Job
	var hd strings.Builder
	fmt.Fprintf(&hd, "❌ <b>orch: %s failed</b> in <b>%s</b>\n", e(string(job.Kind)), e(job.Project))
	title := cmp.Or(job.Task.Title, job.Task.ID)
	ref := e(job.Task.ID)
	if job.Task.PR > 0 {
		ref += fmt.Sprintf(", PR #%d", job.Task.PR)
	}
	if u := job.Task.URL; u != "" && len(u) <= maxURL {
		fmt.Fprintf(&hd, "Task: <a href=\"%s\">%s</a> (%s)\n", attr(u), head(title, maxTitle), ref)
	} else {
		fmt.Fprintf(&hd, "Task: %s (%s)\n", head(title, maxTitle), ref)
	}
	fmt.Fprintf(&hd, "Attempts: %d", f.Attempts)
	if st.MaxAttempts > 0 {
		fmt.Fprintf(&hd, " of %d", st.MaxAttempts)
	}
	hd.WriteString("\n")
	if st.ExitCode != nil {
		fmt.Fprintf(&hd, "Exit code: %d\n", *st.ExitCode)
	}
	if f.Reason != "" {
		fmt.Fprintf(&hd, "Reason: %s\n", head(f.Reason, maxReason))
	}
	if st.CostUSD > 0 {
		fmt.Fprintf(&hd, "Cost: $%.2f", st.CostUSD)
		if st.Turns > 0 {
			fmt.Fprintf(&hd, " (%d turns)", st.Turns)
		}
		hd.WriteString("\n")
	}
	if st.SpentUSD > st.CostUSD {
		fmt.Fprintf(&hd, "Cost of all attempts: $%.2f\n", st.SpentUSD)
	}
	if st.Runner != "" {
		fmt.Fprintf(&hd, "Runner: %s\n", head(st.Runner, 64))
	}
	fmt.Fprintf(&hd, "Job: <code>%s</code>", e(job.ID))
	if u := f.JobURL; u != "" && len(u) <= maxURL {
		fmt.Fprintf(&hd, " · <a href=\"%s\">details</a>", attr(u))
	}
	hd.WriteString("\n")
	if f.LogTail == "" && st.Log != "" {
		// The runner is on another host, or the log is gone: say where
		// it is, the error text below stands in for it.
		fmt.Fprintf(&hd, "Log: <code>%s</code> (not readable here)\n", head(st.Log, 256))
	}

	out := hd.String()
	budget := telegram.MaxMessageLen - telegram.Len(out)
	if st.Error != "" {
		const label = "\nError: "
		// Without a log tail the error may take all the room; with one
		// it takes at most a third.
		n := budget - telegram.Len(label) - 1
		if f.LogTail != "" {
			n = budget / 3
		}
		part := label + head(st.Error, n) + "\n"
		out += part
		budget -= telegram.Len(part)
	}
	const open, close = "\n<pre>", "</pre>"
	if f.LogTail != "" && budget > telegram.Len(open+close)+len(CutMarker)+16 {
		out += open + tail(f.LogTail, budget-telegram.Len(open+close)) + close
	}
	return out
}

// head escapes s and keeps at most n units (as telegram.Len counts) of
// its start, never splitting an entity such as "&amp;".
func head(s string, n int) string {
	esc := e(s)
	if telegram.Len(esc) <= n {
		return esc
	}
	room := n - telegram.Len(CutMarker)
	end, used := 0, 0
	for i, r := range esc {
		w := telegram.Len(string(r))
		if used+w > room {
			break
		}
		used += w
		end = i + len(string(r))
	}
	keep := esc[:end]
	if amp := strings.LastIndexByte(keep, '&'); amp >= 0 && amp > strings.LastIndexByte(keep, ';') {
		keep = keep[:amp]
	}
	return keep + CutMarker
}

// tail escapes s and keeps at most n units of its end, starting at a line
// where it can, and never inside an entity.
func tail(s string, n int) string {
	esc := e(s)
	if telegram.Len(esc) <= n {
		return esc
	}
	room := n - telegram.Len(CutMarker+"\n")
	start, used := len(esc), 0
	for start > 0 {
		r, size := utf8.DecodeLastRuneInString(esc[:start])
		w := telegram.Len(string(r))
		if used+w > room {
			break
		}
		used += w
		start -= size
	}
	// Every '&' in esc opens an entity: one opened before start and not
	// closed before it means start is inside it.
	if amp := strings.LastIndexByte(esc[:start], '&'); amp >= 0 && !strings.Contains(esc[amp:start], ";") {
		start += strings.IndexByte(esc[start:], ';') + 1
	}
	keep := esc[start:]
	if i := strings.IndexByte(keep, '\n'); i >= 0 && i < len(keep)/2 {
		keep = keep[i+1:]
	}
	return CutMarker + "\n" + keep
}

func e(s string) string { return telegram.Escape(s) }

// attr escapes a URL for an href attribute.
func attr(s string) string { return strings.ReplaceAll(telegram.Escape(s), `"`, "&quot;") }

// LogTail returns the last n lines of the file at path, reading at most
// the last 64 KiB. It returns "" when the file cannot be read (the runner
// was on another host, say).
func LogTail(path string, n int) string {
	return strings.Join(filetail.Lines(path, n, 64<<10), "\n")
}
