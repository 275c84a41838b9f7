package queue

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/orch-dev/orch/proto"
)

// MaxTaskBytesDefault bounds a job as it goes on the wire, 256 KiB: the
// person-written text of a pull request or work item is cut to fit it.
const MaxTaskBytesDefault = 256 << 10

// Fit cuts the person-written text of job (the task's body, then the
// trigger text, then the title, each only as far as needed) so that the
// job, encoded as it is published, takes at most limit bytes. Each text
// that was cut ends in a marker saying how much was cut and where the
// whole text is. It returns the bytes cut; an error (ErrPermanent) means
// the job does not fit even with all three texts cut down to their
// markers, or does not encode at all.
//
// Anyone who can open a pull request writes its body, and NATS refuses a
// message over its max payload (1 MiB by default) for good: without the
// cut, one big description would be a job that can never be queued.
func Fit(job *proto.Job, limit int) (int, error) {
	size, err := encodedSize(job)
	if err != nil || size <= limit {
		return 0, err
	}
	cut := 0
	for _, f := range []*string{&job.Task.Body, &job.Trigger, &job.Task.Title} {
		if size <= limit {
			break
		}
		if *f == "" {
			continue
		}
		cut += cutText(f, size-limit, wholeTextAt(job))
		if size, err = encodedSize(job); err != nil {
			return cut, err
		}
	}
	if size > limit {
		return cut, fmt.Errorf("%w: job %s takes %d bytes with its text cut, over ORCH_MAX_TASK_BYTES (%d)",
			ErrPermanent, job.ID, size, limit)
	}
	return cut, nil
}

func encodedSize(job *proto.Job) (int, error) {
	data, err := json.Marshal(job)
	if err != nil {
		return 0, fmt.Errorf("%w: encoding job %s: %v", ErrPermanent, job.ID, err)
	}
	return len(data), nil
}

// wholeTextAt says where a person finds the text a job's marker stands
// for.
func wholeTextAt(job *proto.Job) string {
	switch {
	case job.Task.URL != "":
		return job.Task.URL
	case job.Task.PlaneItem != "":
		return "Plane work item " + job.Task.PlaneItem
	default:
		return "the " + job.Source.System + " event that made this job"
	}
}

// cutMarker ends a text that was cut.
func cutMarker(cut, of int, where string) string {
	return fmt.Sprintf("\n\n[orch: %d of %d bytes cut here to fit the job's size limit; the whole text is at %s]", cut, of, where)
}

// cutText shortens *s so that its JSON encoding is at least over bytes
// shorter, marker included, and returns the bytes cut. It cuts at a rune
// boundary and counts each rune as encoding/json writes it at most, so
// the estimate never falls short.
func cutText(s *string, over int, where string) int {
	text := *s
	// The longest marker this text can get: the cut as long as the text.
	markerLen := quotedLen(cutMarker(len(text), len(text), where))
	budget := quotedLen(text) - over - markerLen
	keep, used := 0, 0
	for keep < len(text) {
		r, size := utf8.DecodeRuneInString(text[keep:])
		n := escapedLen(r, size)
		if used+n > budget {
			break
		}
		used += n
		keep += size
	}
	*s = text[:keep] + cutMarker(len(text)-keep, len(text), where)
	return len(text) - keep
}

// quotedLen is the length of s as encoding/json writes it, without the
// quotes.
func quotedLen(s string) int {
	data, _ := json.Marshal(s) // a string always encodes
	return len(data) - 2
}

// escapedLen is the most bytes encoding/json writes for one rune of size
// bytes: HTML characters, control characters, U+2028, U+2029 and invalid
// bytes as \uXXXX, quote and backslash escaped, the rest as they are.
func escapedLen(r rune, size int) int {
	switch {
	case r == utf8.RuneError && size == 1, r == '\u2028', r == '\u2029', r == '<', r == '>', r == '&':
		return 6
	case r == '"', r == '\\', r == '\n', r == '\r', r == '\t':
		return 2
	case r < 0x20:
		return 6
	}
	return size
}
