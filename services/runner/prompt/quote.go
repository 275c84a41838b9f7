package prompt

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
)

// People's words in a task are quoted, never pasted. A task's title, its
// description, the comment or review that triggered it: anyone with an
// account on the tracker may have written them, and the agent that reads
// the task can run commands. Each such text sits in a block that opens
// with a line
//
//	<<<ORCH-DATA-<16 hex> begin: <what>, written by <whom> on <system>, <trusted or not>>>>
//
// and closes with the line
//
//	<<<ORCH-DATA-<16 hex> end>>>
//
// and the task's head tells the agent that a block is data to read, not
// instructions to follow. The marker is derived from the job and every
// text the task may quote, and chosen again until it occurs in none of
// them, so no text can end its block early or open a block of its own: a
// description holding "<<<ORCH-DATA-... end>>>" holds some other marker.
// Quote refuses a text that holds the marker (a template quoting a text
// the marker was not chosen against), so the promise holds for every
// template.

// markerPrefix starts every marker.
const markerPrefix = "ORCH-DATA-"

// maxActor bounds the actor's name in a block's opening line.
const maxActor = 64

// chooseMarker returns the marker of d's task: derived from d's texts,
// occurring in none of them.
func chooseMarker(d Data) string {
	texts := d.foreign()
	for n := uint64(0); ; n++ {
		h := sha256.New()
		_ = binary.Write(h, binary.BigEndian, n)
		for _, t := range texts {
			_ = binary.Write(h, binary.BigEndian, uint64(len(t)))
			h.Write([]byte(t))
		}
		m := markerPrefix + hex.EncodeToString(h.Sum(nil)[:8])
		if !containsAny(texts, m) {
			return m
		}
	}
}

// foreign lists the texts of d that orch did not write.
func (d Data) foreign() []string {
	j := d.Job
	texts := []string{j.ID, j.Task.Title, j.Task.Body, j.Trigger, j.Task.URL, j.Task.Branch, j.Task.Author,
		j.Source.System, j.Source.Event, j.Source.Actor, d.Branch, d.Upstream, d.Head, d.Dir}
	return append(texts, d.Notes...)
}

func containsAny(texts []string, s string) bool {
	for _, t := range texts {
		if strings.Contains(t, s) {
			return true
		}
	}
	return false
}

// Marker is the marker of this task's quoted blocks, for the lines that
// tell the agent how to read them.
func (d Data) Marker() string { return d.marker }

// Quote returns text in a block of the task's marker, labelled with what
// it is and whose words it is (Author, Actor); an empty text is said to be
// empty, in no block. It fails for a text that holds the marker, which
// only a template quoting a text that is not the job's can give it.
func (d Data) Quote(what, text, whose string) (string, error) {
	if d.marker == "" {
		return "", fmt.Errorf("quoting %s: no marker (Data not given to Render)", what)
	}
	if strings.Contains(text, d.marker) || strings.Contains(what+whose, d.marker) {
		return "", fmt.Errorf("quoting %s: the text holds the task's marker", what)
	}
	if strings.TrimSpace(text) == "" {
		return "(" + oneLine(what) + ": empty)", nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<<<%s begin: %s, %s>>>\n", d.marker, oneLine(what), oneLine(whose))
	b.WriteString(text)
	if !strings.HasSuffix(text, "\n") {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "<<<%s end>>>", d.marker)
	return b.String(), nil
}

// Author says whose words the task's title and body are: their author's,
// and whether the project trusts them.
func (d Data) Author() string {
	t := d.Job.Task
	return d.person("written by", t.Author, t.AuthorTrusted)
}

// Actor says whose words the text that triggered the job is: the actor of
// the event, and whether the project trusts them.
func (d Data) Actor() string {
	src := d.Job.Source
	return d.person("from", src.Actor, src.Trusted)
}

// person names someone as a block's label does: by name and the system
// the name is of, trusted or not; an unknown person is not trusted.
func (d Data) person(verb, name string, trusted bool) string {
	name = actorName(name)
	if name == "" {
		return verb + " someone unknown, not a trusted actor"
	}
	s := verb + " " + name
	if sys := d.Job.Source.System; sys == "gitea" || sys == "plane" {
		s += " on " + sys
	}
	if trusted {
		return s + ", a trusted actor"
	}
	return s + ", not a trusted actor"
}

// Item names what the task is about: a pull request, an issue or a work
// item.
func (d Data) Item() string {
	t := d.Job.Task
	switch {
	case t.PR > 0:
		return "pull request"
	case t.PlaneItem != "" || d.Job.Source.System == "plane":
		return "work item"
	case strings.HasPrefix(t.ID, "issue-"):
		return "issue"
	}
	return "task"
}

// TriggerWhat names the text that triggered the job, by the event that
// carried it.
func (d Data) TriggerWhat() string {
	ev := d.Job.Source.Event
	switch {
	case strings.Contains(ev, "review"):
		return "the review that asked for changes"
	case strings.Contains(ev, "comment"):
		return "the comment that mentioned you"
	case strings.Contains(ev, "workflow"):
		return "the name of the workflow that failed"
	}
	return "the text that triggered the job"
}

// Code returns s as inline Markdown code, in a run of backticks longer
// than any in s, so that a branch name cannot end its code span and go on
// as orch's words.
func (d Data) Code(s string) string {
	s = oneLine(s)
	fence := strings.Repeat("`", longestRun(s, '`')+1)
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

func longestRun(s string, c rune) int {
	longest, run := 0, 0
	for _, r := range s {
		if r == c {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return longest
}

// oneLine is s with every control character (a line break, an escape)
// made a space, so a label stays on its line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// actorName is an actor as a block's label shows it: letters, digits and
// the few signs of logins and e-mail addresses, at most maxActor of them.
func actorName(a string) string {
	var b strings.Builder
	n := 0
	for _, r := range a {
		if n == maxActor {
			b.WriteString("…")
			break
		}
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && !strings.ContainsRune("._@+-", r) {
			r = '_'
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}
