// Package alert renders one terminal failure into a Telegram message a
// person can act on from a phone.
package alert

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

// LogTailLines is how many lines of the agent's log an alert shows.
const LogTailLines = 15

// Failure is what is known of one job that failed for good.
type Failure struct {
	Status   *proto.Status
	Attempts int
	// Reason is JetStream's: "max deliveries" or the Term reason.
	Reason string
	// LogTail is the end of the agent's log, if it could be read.
	LogTail string
	// JobURL links to the job in the gateway, if ORCH_PUBLIC_URL is set.
	JobURL string
}

// Render returns the HTML message, at most telegram.MaxMessageLen
// characters: the log tail, then the error, are cut to fit.
func Render(f Failure) string {
	st, job := f.Status, &f.Status.Job
	var hd strings.Builder
	fmt.Fprintf(&hd, "❌ <b>orch: %s failed</b> in <b>%s</b>\n", e(string(job.Kind)), e(job.Project))
	title := job.Task.Title
	if title == "" {
		title = job.Task.ID
	}
	if job.Task.URL != "" {
		fmt.Fprintf(&hd, "Task: <a href=\"%s\">%s</a> (%s)\n", attr(job.Task.URL), e(title), e(job.Task.ID))
	} else {
		fmt.Fprintf(&hd, "Task: %s (%s)\n", e(title), e(job.Task.ID))
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
		fmt.Fprintf(&hd, "Reason: %s\n", e(f.Reason))
	}
	if st.CostUSD > 0 {
		fmt.Fprintf(&hd, "Cost: $%.2f\n", st.CostUSD)
	}
	fmt.Fprintf(&hd, "Job: <code>%s</code>", e(job.ID))
	if f.JobURL != "" {
		fmt.Fprintf(&hd, " · <a href=\"%s\">details</a>", attr(f.JobURL))
	}
	hd.WriteString("\n")

	budget := telegram.MaxMessageLen - utf8.RuneCountInString(hd.String())
	var out strings.Builder
	out.WriteString(hd.String())
	if st.Error != "" {
		part := "\nError: " + head(st.Error, budget/3) + "\n"
		out.WriteString(part)
		budget -= utf8.RuneCountInString(part)
	}
	if f.LogTail != "" && budget > 40 {
		const open, close = "\n<pre>", "</pre>"
		out.WriteString(open + tail(f.LogTail, budget-len(open)-len(close)) + close)
	}
	return out.String()
}

// cutMarker shows where text was cut.
const cutMarker = "…[cut]"

// head escapes s and keeps at most n characters of its start, never
// splitting an entity such as "&amp;".
func head(s string, n int) string {
	r := []rune(e(s))
	if len(r) <= n {
		return string(r)
	}
	keep := string(r[:max(n-utf8.RuneCountInString(cutMarker), 0)])
	if amp := strings.LastIndexByte(keep, '&'); amp > strings.LastIndexByte(keep, ';') {
		keep = keep[:amp]
	}
	return keep + cutMarker
}

// tail escapes s and keeps at most n characters of its end, starting at a
// line where it can.
func tail(s string, n int) string {
	r := []rune(e(s))
	if len(r) <= n {
		return string(r)
	}
	keep := string(r[len(r)-max(n-utf8.RuneCountInString(cutMarker)-1, 0):])
	if i := strings.IndexByte(keep, '\n'); i >= 0 {
		keep = keep[i+1:]
	} else if i := strings.IndexByte(keep, ';'); i >= 0 && i < strings.IndexByte(keep+"&", '&') {
		keep = keep[i+1:] // the start may be the inside of an entity
	}
	return cutMarker + "\n" + keep
}

func e(s string) string { return telegram.Escape(s) }

// attr escapes a URL for an href attribute.
func attr(s string) string { return strings.ReplaceAll(telegram.Escape(s), `"`, "&quot;") }

// LogTail returns the last n lines of the file at path, reading at most
// the last 64 KiB. It returns "" when the file cannot be read (the runner
// was on another host, say).
func LogTail(path string, n int) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(-window, io.SeekEnd)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), window)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
