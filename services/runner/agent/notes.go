package agent

import (
	"io"
	"strings"
	"sync"
)

// Notes carry the runner's own lines into an agent's log while the agent
// runs, between its output (the egress proxy's "orch: egress denied"
// lines). A line written while no agent runs is dropped. The zero value
// is ready to use; it is safe for concurrent use.
type Notes struct {
	mu   sync.Mutex
	w    io.Writer
	wake func()
}

// Line writes line, ending it with a newline, into the log of the run
// the notes are attached to, if any. Nil notes drop it.
func (n *Notes) Line(line string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.w == nil {
		return
	}
	if !strings.HasSuffix(line, "\n") {
		line += "\n"
	}
	// One write: the file's offset is shared with the agent's output (or
	// its drain), and the kernel keeps a write whole.
	_, _ = io.WriteString(n.w, line)
	if n.wake != nil {
		n.wake()
	}
}

// attach directs the lines to w, calling wake after each (nil: none); a
// nil w drops them from then on.
func (n *Notes) attach(w io.Writer, wake func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.w, n.wake = w, wake
}
