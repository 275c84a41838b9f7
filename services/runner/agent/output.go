package agent

// The agent's output, when Spec.Drained is set.
//
// The agent's stdout and stderr are then one pipe, and this process drains
// it into the log file in large writes, calling Spec.Drained after each,
// so that the log stream's publisher reads the file at once. A write to a
// pipe costs the agent less than a write to a file, where the filesystem
// does its bookkeeping on every write; what must hold for that to stay
// true:
//
//   - The drain never waits in the kernel for output. A write into a pipe
//     that a reader waits on (in read, or in poll or epoll, which mark the
//     pipe for good) wakes that reader, and a wakeup per line costs the
//     agent more than the file did. So the read end is non-blocking and
//     outside Go's poller, and the drain sleeps between reads: readGap
//     after a read that emptied the pipe, letting output gather, and
//     twice as long after each read that found nothing, up to idleGap.
//     An idle agent's next line is seen within idleGap, well inside the
//     log stream's batching delay.
//   - The pipe holds pipeSize (the kernel's default cap), so the agent
//     prints on while the drain sleeps or writes the file.
//   - The drain does nothing but read and write: the network never holds
//     the agent up, and a stalled disk stops the drain only as it stopped
//     an agent writing its own file, once the pipe is full. The file is
//     the publisher's buffer, as it was when the agent wrote it.
//   - Run returns only once the drain has read to the end of the pipe,
//     so the file holds all the output. A descendant that somehow
//     outlives the supervisor's sweep and keeps the pipe open holds Run
//     up for OutputWaitDelay at most; then the pipe is closed and such a
//     process gets EPIPE.
//
// If the runner dies during an attempt, the output still in the pipe and
// in the drain's buffer is lost with it, and so is the end of the log
// file; the agent dies with the runner (see supervisor.go), so there is
// no later output to miss.

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// OutputWaitDelay bounds how long Run waits, once the agent and everything
// it started are gone, for the end of their output.
const OutputWaitDelay = 2 * time.Second

const (
	pipeSize = 1 << 20
	readSize = 256 << 10
	// readGap is the pause after a read that emptied the pipe.
	readGap = 2 * time.Millisecond
	// idleGap is the longest pause, reached while the agent is silent.
	idleGap = 50 * time.Millisecond
)

// drain copies the agent's output pipe to the log file. Its goroutine
// ends at the end of the pipe or when abandoned.
type drain struct {
	fd      int // the pipe's read end, non-blocking
	file    *os.File
	drained func()
	abandon chan struct{}
	done    chan struct{}
}

// outputPipe returns the read end (a raw, non-blocking descriptor, outside
// Go's poller) and the write end (blocking, as the agent expects its
// stdout to be) of a new pipe.
func outputPipe() (int, *os.File, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return -1, nil, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		return -1, nil, err
	}
	// A smaller pipe only means the agent waits for the drain sooner:
	// the size is a wish (a user past its pipe quota gets EPERM).
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
	return fds[0], os.NewFile(uintptr(fds[1]), "agent-output"), nil
}

// startDrain drains fd into file until the pipe's end.
func startDrain(fd int, file *os.File, drained func()) *drain {
	d := &drain{fd: fd, file: file, drained: drained, abandon: make(chan struct{}), done: make(chan struct{})}
	go d.run()
	return d
}

func (d *drain) run() {
	defer close(d.done)
	buf := make([]byte, readSize)
	gap := time.Duration(0)
	for {
		if gap > 0 {
			t := time.NewTimer(gap)
			select {
			case <-d.abandon:
				t.Stop()
				return
			case <-t.C:
			}
		}
		n, err := unix.Read(d.fd, buf)
		switch {
		case n > 0:
			d.copy(buf[:n])
			gap = readGap
			if n == len(buf) {
				gap = 0 // there may be more at once
			}
		case err == nil: // the end: every write end is closed
			return
		case errors.Is(err, unix.EAGAIN):
			gap = min(max(2*gap, readGap), idleGap)
		case errors.Is(err, unix.EINTR):
		default:
			d.note("orch: reading agent output: %v\n", err)
			return
		}
		if gap == 0 {
			select {
			case <-d.abandon:
				return
			default:
			}
		}
	}
}

// copy writes a chunk to the file. A write that fails (a full disk)
// loses the chunk, as it would have lost the agent's own write.
func (d *drain) copy(b []byte) {
	_, _ = d.file.Write(b)
	d.drained()
}

func (d *drain) note(format string, args ...any) {
	d.copy(fmt.Appendf(nil, format, args...))
}

// wait waits for the end of the output, at most delay, and closes the
// pipe. Call it once the supervisor has been reaped.
func (d *drain) wait(delay time.Duration) {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-d.done:
	case <-t.C:
		close(d.abandon)
		<-d.done
		d.note("orch: output ignored after the agent ended: a process left behind still held it open after %v\n", delay)
	}
	_ = unix.Close(d.fd)
}
