package agent

import (
	"bytes"
	"io"
	"os"
)

// resumeRefusal is what Claude Code prints (on stderr, and in its result's
// errors) and then exits 1, having done nothing, when --resume names a
// session it does not have: "No conversation found with session ID:
// <id>" (Claude Code 2.1.197).
var resumeRefusal = []byte("No conversation found with session ID")

// resumeTail is how much of the end of a log ResumeRefused reads: the
// refusal comes before any turn, so the log is short.
const resumeTail = 64 << 10

// ResumeRefused says the run whose output is in logPath ended because the
// agent did not know the session it was asked to resume.
func ResumeRefused(logPath string) bool {
	f, err := os.Open(logPath)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	off := max(fi.Size()-resumeTail, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
		return false
	}
	return bytes.Contains(buf, resumeRefusal)
}
