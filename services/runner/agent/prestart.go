package agent

// Agents started up to a gate.
//
// A confined agent's start is mostly its sandbox's: bwrap's namespaces
// and mounts take milliseconds, several times an exec. What a job does
// before its agent's start (admission's writes, the worktree's checks,
// the task text) changes nothing the sandbox is made of, so the runner
// may make the sandbox beside that work and let the agent start once the
// job may run.
//
// A spec that is Gated runs nothing of the agent's before a byte can be
// read from descriptor GateFD (bwrap's --block-fd, which bwrap reads once
// the sandbox is made, and closes before it runs the agent). Prestart
// starts such a spec up to its gate; Run, given it in Spec.Started, opens
// the gate, and Abort ends it unopened. The gate is a pipe whose write
// end the supervisor holds as well as the runner, until the agent ends:
// when the runner dies, the gate does not open by its end of file; the
// supervisor sees the same end on its socket and kills the sandbox.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// GateFD is the descriptor of the gate's read end in a gated order's
// command.
const GateFD = 3

// Started is an agent started up to its gate (Prestart).
type Started struct {
	p     *Pool
	o     order
	sup   *supervisor
	stdin *os.File
	outR  int
	// gate is the runner's write end of the gate.
	gate *os.File
}

// Prestart starts s's agent up to its gate: its supervisor has its
// order, and its sandbox is being made. s must be Gated; its Stdin and
// Drained are Run's. The result is to be given to Run (Spec.Started) or
// ended with Abort.
func (p *Pool) Prestart(s Spec) (*Started, error) {
	o := s.order()
	if !o.Gated || len(o.Argv) == 0 {
		return nil, errors.New("only a gated agent command can be started ahead")
	}
	if len(s.Files) > maxFiles-4 {
		return nil, fmt.Errorf("%d files for the agent command, at most %d", len(s.Files), maxFiles-4)
	}
	stdin, err := stdinFile("")
	if err != nil {
		return nil, err
	}
	o.Files = len(s.Files)
	sup, outR, gate, err := p.launch(o, stdin, nil, s.Files...)
	if err != nil {
		_ = stdin.Close()
		return nil, err
	}
	return &Started{p: p, o: o, sup: sup, stdin: stdin, outR: outR, gate: gate}, nil
}

// matches reports whether o is the order st was started with.
func (st *Started) matches(o order) bool {
	return slices.Equal(st.o.Argv, o.Argv) && st.o.Dir == o.Dir && slices.Equal(st.o.Env, o.Env) &&
		st.o.Grace == o.Grace && st.o.Forward == o.Forward && st.o.Gated == o.Gated
}

// open lets the agent start. A sandbox that ended meanwhile cannot read
// the byte; its supervisor reports how it ended.
func (st *Started) open() {
	openGate(st.gate)
	_ = st.stdin.Close() // the supervisor's copy is the agent's
}

// openGate writes the byte that lets a gated agent start, and closes the
// runner's end.
func openGate(gate *os.File) {
	_, _ = gate.Write([]byte{1})
	_ = gate.Close()
}

// Abort ends an agent started up to its gate without opening it: nothing
// of the agent's ran. It returns once the supervisor has killed and
// reaped the sandbox.
func (st *Started) Abort() {
	st.sup.signal(syscall.SIGTERM)
	st.sup.await()
	st.p.finish(st.sup, false)
	_ = st.gate.Close()
	_ = st.stdin.Close()
	_ = unix.Close(st.outR)
}

// order is the order that runs s.
func (s Spec) order() order {
	dir := s.Dir
	if dir == "" {
		// The runner's own, as a process it started would have.
		dir, _ = os.Getwd()
	}
	return order{Argv: s.Argv, Dir: dir, Env: s.Env, Grace: max(s.KillGrace, 0), Forward: s.Forward, Gated: s.Gated}
}

// startNow gives o, s's order, to a supervisor with its streams: the task
// text in stdin, the output into a pipe when s is Drained (outR, its read
// end; else -1) or into logf. A gated order's gate opens at once.
func (p *Pool) startNow(s Spec, o order, logf *os.File) (sup *supervisor, outR int, err error) {
	stdin, err := stdinFile(s.Stdin)
	if err != nil {
		return nil, -1, err
	}
	defer stdin.Close() // the supervisor's copy is the agent's
	if s.Drained != nil {
		logf = nil // into a pipe
	}
	sup, outR, gate, err := p.launch(o, stdin, logf)
	if gate != nil {
		openGate(gate)
	}
	return sup, outR, err
}

// launch gives o to a supervisor with the agent's streams: stdin, and the
// output into logf or, when logf is nil, into a pipe whose read end is
// outR (else -1). A gated order's gate is made, and its write end
// returned shut; files follow the gate's ends.
func (p *Pool) launch(o order, stdin, logf *os.File, files ...*os.File) (sup *supervisor, outR int, gate *os.File, err error) {
	out, outR := logf, -1
	if logf == nil {
		r, w, err := outputPipe()
		if err != nil {
			return nil, -1, nil, fmt.Errorf("creating output pipe: %w", err)
		}
		// The supervisor and the agent hold the write end once sent; the
		// pipe ends when the agent and what it left are gone and the
		// supervisor has let go of it.
		defer w.Close()
		out, outR = w, r
	}
	var ends []*os.File
	if o.Gated {
		gr, gw, err := os.Pipe()
		if err != nil {
			if outR >= 0 {
				_ = unix.Close(outR)
			}
			return nil, -1, nil, fmt.Errorf("creating the gate: %w", err)
		}
		defer gr.Close() // the supervisor's once sent
		ends, gate = append([]*os.File{gr, gw}, files...), gw
	}
	if sup, err = p.start(o, stdin, out, ends...); err != nil {
		if outR >= 0 {
			_ = unix.Close(outR)
		}
		if gate != nil {
			_ = gate.Close()
		}
		return nil, -1, nil, err
	}
	return sup, outR, gate, nil
}

// stdinFile is a file with no name holding text (memfd_create), to be
// the agent's standard input: no goroutine has to copy it, an agent that
// never reads it cannot block anything, and no file system is written
// for it. Its offset is left at the start.
func stdinFile(text string) (*os.File, error) {
	fd, err := unix.MemfdCreate("orch-stdin", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating stdin file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "orch-stdin")
	if _, err := f.WriteAt([]byte(text), 0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("writing stdin file: %w", err)
	}
	return f, nil
}
