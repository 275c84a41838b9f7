// Package trigger turns a verified webhook delivery into the jobs it asks
// for. It is pure: no I/O, so the whole trigger table is table-tested.
package trigger

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
)

// Decision is what one delivery asks for: jobs to queue, a task whose open
// jobs are to be cancelled, or neither, with the reason in Ignored. A
// closed pull request sets both Cancel and Jobs (the cleanup job).
type Decision struct {
	// Cancel names a task whose open jobs are cancelled before Jobs are
	// queued.
	Cancel *Cancel
	// Jobs to queue.
	Jobs []proto.Job
	// Ignored says why nothing is done.
	Ignored string
}

// Cancel asks for the open jobs of one task to be cancelled.
type Cancel struct {
	Project string `json:"project"`
	Task    string `json:"task"`
	// Reason is logged and shown in the answer.
	Reason string `json:"reason,omitempty"`
}

// Ignore is a Decision that queues nothing, for the reason given.
func Ignore(format string, args ...any) Decision {
	return Decision{Ignored: fmt.Sprintf(format, args...)}
}

// AgentBranchPrefix starts the branch of every agent task: agent/<task>.
const AgentBranchPrefix = "agent/"

// TaskOfBranch returns the task of an agent branch, and false for any
// other branch.
func TaskOfBranch(branch string) (string, bool) {
	rest, ok := strings.CutPrefix(branch, AgentBranchPrefix)
	if !ok || proto.Token(rest) == "_" {
		return "", false
	}
	return proto.Token(rest), true
}

// TaskID sanitizes a task id from a payload onto proto.Token's set, so no
// payload can make a path, a branch or a subject escape.
func TaskID(s string) string { return proto.Token(s) }

// Mentions reports whether text mentions who (such as "@agent") as a
// whole name: "@agent" is not found in "@agent-bot", "@agents" or
// "me@agent.example".
func Mentions(text, who string) bool {
	if who == "" {
		return false
	}
	for i := 0; i < len(text); {
		j := strings.Index(text[i:], who)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(who)
		before, _ := utf8.DecodeLastRuneInString(text[:start])
		after, size := utf8.DecodeRuneInString(text[end:])
		next, _ := utf8.DecodeRuneInString(text[min(end+size, len(text)):])
		startOK := start == 0 || !nameRune(before)
		endOK := end == len(text) || !nameRune(after) && !(after == '.' && nameRune(next) && end+size < len(text))
		if startOK && endOK {
			return true
		}
		i = end
	}
	return false
}

// nameRune reports a rune that can continue a user name.
func nameRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-'
}

// newJob builds a job whose id follows from key, so that a repeated event
// names the same job.
func newJob(p *registry.Project, kind proto.Kind, key string, task proto.Task, src proto.Source, now time.Time) proto.Job {
	task.ID = TaskID(task.ID)
	return proto.Job{
		Schema:    proto.SchemaVersion,
		ID:        proto.JobID(p.Key + "|" + string(kind) + "|" + key),
		Kind:      kind,
		Project:   p.Key,
		Task:      task,
		Source:    src,
		CreatedAt: now.UTC(),
	}
}

// truncate bounds text copied from a payload into a job.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// MaxTriggerText bounds Job.Trigger, the comment or review that caused a
// job.
const MaxTriggerText = 16 << 10
