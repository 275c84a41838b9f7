package writeback

import (
	"fmt"
	"html"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/orch-dev/orch/proto"
)

// Limits on what a comment shows.
const (
	// MaxResultText is how much of the agent's final message a done job's
	// comment shows.
	MaxResultText = 4000
	// maxReason bounds the error text of a retrying or failed job.
	maxReason = 600
	// LogTailLines is how many lines of the agent's log a failed job's
	// comment shows, when the log is readable from the notifier.
	LogTailLines = 20
)

// View is what one rendering of a job's comment knows.
type View struct {
	Status *proto.Status
	// JobURL is the job's page under ORCH_PUBLIC_URL, or empty.
	JobURL string
	// LogTail is the end of the agent's log, scrubbed, or empty.
	LogTail string
}

// summary is a comment's content, before it is written as Markdown
// (Gitea) or HTML (Plane). Every field is plain text.
type summary struct {
	icon, state string
	// lines are short facts, each on a line of its own.
	lines []string
	// result is the agent's final message (Markdown as the agent wrote
	// it), reason the error of a failed or retrying attempt.
	result, reason, logTail string
	// retry says how to run the job again after it failed.
	retry string
}

func when(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }

// summarize decides what a comment says about st.
func summarize(v View) summary {
	st := v.Status
	attempt := fmt.Sprintf("attempt %d", max(st.Attempt, 1))
	if st.MaxAttempts > 0 {
		attempt += fmt.Sprintf(" of %d", st.MaxAttempts)
	}
	s := summary{state: string(st.State)}
	switch st.State {
	case proto.StateQueued:
		s.icon = "⏳"
		s.lines = append(s.lines, "Waiting for a runner since "+when(st.Job.CreatedAt)+".")
	case proto.StateHeld:
		s.icon = "⏸"
		s.lines = append(s.lines, heldLine(st))
	case proto.StateRunning:
		s.icon = "🔄"
		line := "Working on it: " + attempt
		if !st.StartedAt.IsZero() {
			line += ", started " + when(st.StartedAt)
		}
		s.lines = append(s.lines, line+".")
	case proto.StateRetrying:
		s.icon = "🔁"
		s.lines = append(s.lines, "The "+attempt+" failed"+at(st.FinishedAt)+"; it will be tried again after a short delay.")
		s.reason = st.Error
	case proto.StateDone:
		s.icon = "✅"
		s.result = st.Result
		s.lines = append(s.lines, figures(st, attempt))
	case proto.StateFailed:
		s.icon = "❌"
		s.lines = append(s.lines, "Failed for good"+at(st.FinishedAt)+" after "+attempt+".")
		s.reason = cmpOr(st.Error, "no error text was recorded")
		s.logTail = v.LogTail
		s.retry = "To try again, mention the agent here once more, or re-run the job: `POST /jobs/" + st.Job.ID + "/retry` on the orch gateway."
	case proto.StateCancelled:
		s.icon = "🚫"
		if st.SupersededBy != "" {
			s.lines = append(s.lines, "Superseded"+at(cmpTime(st.FinishedAt, st.UpdatedAt))+" by job "+st.SupersededBy+", a newer "+string(st.Job.Kind)+" of this task, which runs instead.")
			break
		}
		s.lines = append(s.lines, "Cancelled"+at(cmpTime(st.FinishedAt, st.UpdatedAt))+".")
	default:
		s.icon = "•"
	}
	return s
}

// heldLine says why a held job waits and until when.
func heldLine(st *proto.Status) string {
	switch st.HeldReason {
	case proto.HoldOverBudget:
		line := "held: budget spent. The project's budget is used up"
		if !st.HeldUntil.IsZero() {
			line += "; the job runs by itself when the budget window resets at " + when(st.HeldUntil)
		}
		return line + ", or when the budget is raised."
	case proto.HoldUsageLimit:
		if st.HeldUntil.IsZero() {
			return "waiting for the usage limit to reset."
		}
		return "waiting for the usage limit to reset at " + when(st.HeldUntil) + "."
	case proto.HoldOperator:
		return "held: an operator paused the project; the job runs when it is resumed."
	}
	return "held: it runs when its hold ends."
}

func at(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return " at " + when(t)
}

// figures is the line under a done job: how long, how many turns, what it
// cost, which attempt.
func figures(st *proto.Status, attempt string) string {
	var parts []string
	if !st.StartedAt.IsZero() && st.FinishedAt.After(st.StartedAt) {
		parts = append(parts, "took "+st.FinishedAt.Sub(st.StartedAt).Round(time.Second).String())
	}
	if st.Turns > 0 {
		parts = append(parts, fmt.Sprintf("%d turns", st.Turns))
	}
	if st.CostUSD > 0 {
		parts = append(parts, fmt.Sprintf("$%.2f", st.CostUSD))
	}
	if st.SpentUSD > st.CostUSD {
		parts = append(parts, fmt.Sprintf("$%.2f with the earlier attempts", st.SpentUSD))
	}
	parts = append(parts, attempt)
	return "Done: " + strings.Join(parts, " · ") + "."
}

// GiteaBody is the Markdown body of job st's tracking comment on Gitea. It
// opens with the hidden marker by which the notifier finds it again and
// the gateway knows it for orch's own.
func GiteaBody(v View) string {
	st, s := v.Status, summarize(v)
	var b strings.Builder
	b.WriteString(proto.CommentMarker(st.Job.ID) + "\n")
	fmt.Fprintf(&b, "### %s orch · %s · %s\n\n", s.icon, st.Job.Kind, s.state)
	for _, l := range s.lines {
		b.WriteString(mdText(l) + "\n")
	}
	if s.result != "" {
		// The agent's own Markdown, shown as it wrote it; only an HTML
		// comment opener is defused, so no text can forge a marker.
		b.WriteString("\n" + strings.ReplaceAll(cut(s.result, MaxResultText), "<!--", "&lt;!--") + "\n")
	}
	if s.reason != "" {
		b.WriteString("\n**Reason:** " + mdText(cut(s.reason, maxReason)) + "\n")
	}
	if s.logTail != "" {
		b.WriteString("\n<details><summary>Last lines of the agent's log</summary>\n\n````text\n" +
			strings.ReplaceAll(s.logTail, "````", "` ` ` `") + "\n````\n</details>\n")
	}
	if s.retry != "" {
		b.WriteString("\n" + s.retry + "\n")
	}
	b.WriteString("\n<sub>" + footer(v, mdLink) + "</sub>\n")
	return b.String()
}

// PlaneHTML is the comment_html of job st's tracking comment on Plane.
func PlaneHTML(v View) string {
	st, s := v.Status, summarize(v)
	var b strings.Builder
	fmt.Fprintf(&b, "<p><strong>%s orch · %s · %s</strong></p>", s.icon, html.EscapeString(string(st.Job.Kind)), html.EscapeString(s.state))
	for _, l := range s.lines {
		b.WriteString("<p>" + html.EscapeString(l) + "</p>")
	}
	if s.result != "" {
		for _, para := range strings.Split(cut(s.result, MaxResultText), "\n\n") {
			if strings.TrimSpace(para) != "" {
				b.WriteString("<p>" + strings.ReplaceAll(html.EscapeString(para), "\n", "<br>") + "</p>")
			}
		}
	}
	if s.reason != "" {
		b.WriteString("<p><strong>Reason:</strong> " + html.EscapeString(cut(s.reason, maxReason)) + "</p>")
	}
	if s.logTail != "" {
		b.WriteString("<p>Last lines of the agent's log:</p><pre><code>" + html.EscapeString(s.logTail) + "</code></pre>")
	}
	if s.retry != "" {
		b.WriteString("<p>" + html.EscapeString(strings.ReplaceAll(s.retry, "`", "")) + "</p>")
	}
	b.WriteString("<p><em>" + footer(v, htmlLink) + "</em></p>")
	return b.String()
}

func footer(v View, link func(text, url string) string) string {
	id := v.Status.Job.ID
	if v.JobURL != "" {
		return "orch job " + link(id, v.JobURL)
	}
	return "orch job " + id
}

func mdLink(text, u string) string { return "[" + mdText(text) + "](" + u + ")" }
func htmlLink(text, u string) string {
	return `<a href="` + html.EscapeString(u) + `">` + html.EscapeString(text) + "</a>"
}

// mdText keeps plain text from turning into Markdown or HTML.
func mdText(s string) string {
	r := strings.NewReplacer("<", "&lt;", ">", "&gt;", "*", `\*`, "_", `\_`, "`", "'", "[", `\[`, "]", `\]`)
	return r.Replace(s)
}

// StatusOf is the commit status of job st: pending while it waits or
// runs, then success, failure or error (cancelled).
func StatusOf(st *proto.Status, jobURL string) CommitStatus {
	cs := CommitStatus{Context: proto.StatusContextPrefix + string(st.Job.Kind), TargetURL: jobURL}
	attempt := fmt.Sprintf("attempt %d of %d", max(st.Attempt, 1), max(st.MaxAttempts, st.Attempt, 1))
	switch st.State {
	case proto.StateQueued:
		cs.State, cs.Description = "pending", "orch: queued"
	case proto.StateHeld:
		cs.State, cs.Description = "pending", cut("orch: "+strings.TrimSuffix(heldLine(st), "."), 140)
	case proto.StateRunning:
		cs.State, cs.Description = "pending", "orch: running, "+attempt
	case proto.StateRetrying:
		cs.State, cs.Description = "pending", "orch: "+attempt+" failed, retrying"
	case proto.StateDone:
		cs.State, cs.Description = "success", "orch: done"
	case proto.StateFailed:
		cs.State, cs.Description = "failure", cut("orch: failed: "+firstLine(st.Error), 140)
	default:
		cs.State, cs.Description = "error", "orch: "+string(st.State)
	}
	return cs
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// cut keeps at most n bytes of s, marking the cut, never splitting a
// character.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " …[cut]"
	n -= len(mark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:max(n, 0)] + mark
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func cmpTime(a, b time.Time) time.Time {
	if !a.IsZero() {
		return a
	}
	return b
}

// WorkspaceOf returns the runner's workspace root from the path of an
// attempt's log (<workspace>/logs/<job>/<attempt>.log), or "".
func WorkspaceOf(logPath string) string {
	if logPath == "" {
		return ""
	}
	dir := filepath.Dir(filepath.Dir(logPath))
	if filepath.Base(dir) != "logs" {
		return ""
	}
	return filepath.Dir(dir)
}
