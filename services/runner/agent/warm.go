package agent

// Supervisors started ahead.
//
// A supervisor is the runner's own binary re-executed (supervisor.go), and
// a Go program's start (loading the binary, the runtime, every package's
// initialisation) is most of what an agent's start costs: several
// milliseconds of CPU on every job, more than the agent's own exec. So a
// supervisor is started before it has an agent to run, and waits: its
// control socket (fd 3, a unix stream socket whose other end the runner
// holds) brings it an order, the agent's argv, directory, environment
// and kill grace, with the agent's standard input and output as passed
// descriptors (SCM_RIGHTS). Until then it runs nothing and holds nothing
// of a job's: its own environment names only itself, and its standard
// streams are /dev/null. When the agent has ended by itself and its
// leftovers are gone, it lets go of the job's streams, directory and
// environment, reports how the agent ended (result) and waits for the
// next order, so that most jobs pay no supervisor's start at all.
//
// The guarantees of supervisor.go hold from its start, warm or not: the
// socket's end of file is the runner's death (a supervisor still waiting
// just exits), and Pdeathsig is bound to a thread that the starting
// goroutine keeps locked until the supervisor is reaped.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// order is what a supervisor is told to run.
type order struct {
	Argv  []string      `json:"argv"`
	Dir   string        `json:"dir"`
	Env   []string      `json:"env"`
	Grace time.Duration `json:"grace"`
	// Forward is the unix socket that the supervisor's forwarder leads
	// to while this agent runs (Forwarding); "" for none.
	Forward string `json:"forward,omitempty"`
	// Gated says the order comes with a gate, a pipe's two ends, after
	// the agent's streams: the supervisor gives the read end to the
	// command as GateFD and holds the write end until the agent ends
	// (prestart.go).
	Gated bool `json:"gated,omitempty"`
	// Files is how many descriptors follow the gate's ends: the
	// command's from GateFD+1 on (Spec.Files).
	Files int `json:"files,omitempty"`
}

// maxFiles bounds the descriptors an order comes with: the agent's two
// streams, the gate's two ends and a gated command's own.
const maxFiles = 8

// maxOrder bounds an order's size: an argv and environment the kernel
// would refuse to exec are far smaller.
const maxOrder = 16 << 20

// supervisor is a started supervisor process, from the runner's side.
type supervisor struct {
	cmd *exec.Cmd
	// ctl is the runner's end of the control socket.
	ctl *os.File
	// reaped is closed once cmd.Wait has returned: the thread that
	// started the process may go.
	reaped chan struct{}
	// wrapped says cmd's process is the wrapper that started the
	// supervisor in a namespace of its own (Forwarding), and pidfd is
	// then the supervisor's own process, once its first answer named it
	// (else -1).
	wrapped bool
	pidfd   int
}

// startSupervisor starts a supervisor that waits for its order, in a
// network namespace of its own where fwd says so.
func startSupervisor(fwd *Forwarding) (*supervisor, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating control socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "orch-ctl"), os.NewFile(uintptr(fds[1]), "orch-ctl")
	defer theirs.Close()
	s := &supervisor{ctl: ours, reaped: make(chan struct{}), pidfd: -1}
	s.cmd = &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{supervisorName},
		Dir:        "/",
		Env:        []string{supervisorEnv + "=1"},
		ExtraFiles: []*os.File{theirs},
		SysProcAttr: &syscall.SysProcAttr{
			// Its own session, and so its own group: a terminal's Ctrl-C
			// reaches the runner only, which decides what happens to the
			// agent, and the agent has no controlling terminal to push
			// input into (TIOCSTI), confined or not.
			Setsid: true,
			// A second signal of the runner's death, besides the socket.
			Pdeathsig: syscall.SIGTERM,
		},
	}
	if fwd != nil {
		if err := fwd.wrap(s.cmd); err != nil {
			_ = ours.Close()
			return nil, err
		}
		s.wrapped = true
	}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig is bound to the thread that starts the child, and Go
		// may retire threads: this one stays until the supervisor is
		// reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := s.cmd.Start()
		started <- err
		if err == nil {
			<-s.reaped
		}
	}()
	if err := <-started; err != nil {
		_ = ours.Close()
		return nil, fmt.Errorf("starting agent supervisor: %w", err)
	}
	return s, nil
}

// A supervisor answers its order with orderTaken and its own process id
// (4 bytes, big-endian): takenLen bytes.
const (
	orderTaken = 1
	takenLen   = 5
)

// takenTimeout bounds the wait for a supervisor's answer to its order: a
// live one answers at once.
const takenTimeout = 10 * time.Second

// errNotTaken is a supervisor that ended, or never answered, without
// taking its order.
var errNotTaken = errors.New("the agent supervisor did not take its order")

// send gives the supervisor its order, with stdin and out (the agent's
// stdout and stderr) and more (a gated order's gate ends and files) as
// descriptors, and waits until it answers that it took it. A supervisor
// killed while it waited can still accept the message: its socket closes
// only when the last of its threads is gone, after its main thread
// already shows as a zombie. Such a one never answers (errNotTaken), and
// the job is not lost to it.
func (s *supervisor) send(o order, stdin, out *os.File, more ...*os.File) error {
	body, err := json.Marshal(o)
	if err != nil {
		return err
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	msg = append(msg, body...)
	passed := []int{int(stdin.Fd()), int(out.Fd())}
	for _, f := range more {
		passed = append(passed, int(f.Fd()))
	}
	rights := unix.UnixRights(passed...)
	// A blocking stream socket takes the whole message, the descriptors
	// with its first byte.
	err = ignoringEINTR(func() error { return unix.Sendmsg(int(s.ctl.Fd()), msg, rights, nil, unix.MSG_NOSIGNAL) })
	runtime.KeepAlive(stdin)
	runtime.KeepAlive(out)
	runtime.KeepAlive(more)
	if err != nil {
		return err
	}
	fds := []unix.PollFd{{Fd: int32(s.ctl.Fd()), Events: unix.POLLIN}}
	n := 0
	err = ignoringEINTR(func() (err error) {
		n, err = unix.Poll(fds, int(takenTimeout/time.Millisecond))
		return err
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return errNotTaken // no answer in time
	}
	var b [takenLen]byte
	if n, _ := io.ReadFull(s.ctl, b[:]); n != takenLen || b[0] != orderTaken {
		return errNotTaken
	}
	if s.wrapped && s.pidfd < 0 {
		// Wrapped (Forwarding): signals are for the supervisor, not
		// for its wrapper. A pidfd, opened while the supervisor is
		// known alive (it just answered), names it even once its id
		// is free again.
		fd, err := unix.PidfdOpen(int(binary.BigEndian.Uint32(b[1:])), 0)
		if err != nil {
			return fmt.Errorf("the agent supervisor's process: %w", err)
		}
		s.pidfd = fd
	}
	return nil
}

// signal sends sig to the supervisor itself; to its wrapper while its
// pid is not known yet, which a SIGKILL ends with the supervisor
// (--die-with-parent), as a killed supervisor ends its wrapper.
func (s *supervisor) signal(sig syscall.Signal) {
	if s.pidfd >= 0 {
		_ = unix.PidfdSendSignal(s.pidfd, sig, nil, 0)
		return
	}
	_ = s.cmd.Process.Signal(sig)
}

// reap waits for the supervisor to exit, once.
func (s *supervisor) reap() {
	select {
	case <-s.reaped:
	default:
		_ = s.cmd.Wait()
		close(s.reaped)
	}
}

// discard ends a supervisor that is not to run another agent: the end of
// file on its socket ends one that waits for an order.
func (s *supervisor) discard() {
	_ = s.ctl.Close()
	s.reap()
	if s.pidfd >= 0 {
		_ = unix.Close(s.pidfd)
	}
}

// kill ends a supervisor that did not take its order: dead already, or
// stuck where it should have answered at once.
func (s *supervisor) kill() {
	s.signal(syscall.SIGKILL)
	s.discard()
}

// ended is how a supervisor's agent ended.
type ended struct {
	status syscall.WaitStatus
	// cpu is the CPU time of the agent, what it left behind and the
	// supervisor while it ran.
	cpu time.Duration
	// again says the supervisor waits for another order.
	again bool
}

// await waits until the supervisor reports how its agent ended. One that
// exits without a report (killed) is reaped, and its own exit status
// stands for the agent's: it mirrors it.
func (s *supervisor) await() ended {
	var b [resultLen]byte
	if _, err := io.ReadFull(s.ctl, b[:]); err == nil && b[0] == resultTag {
		e := ended{status: syscall.WaitStatus(binary.BigEndian.Uint32(b[1:5])),
			cpu: time.Duration(binary.BigEndian.Uint64(b[5:13])), again: b[13] == 1}
		if !e.again {
			s.reap()
		}
		return e
	}
	s.reap()
	ps := s.cmd.ProcessState
	ws, _ := ps.Sys().(syscall.WaitStatus)
	return ended{status: ws, cpu: ps.UserTime() + ps.SystemTime()}
}

// ignoringEINTR calls f again while it fails with EINTR, and returns
// its first other answer.
func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// receive reads the supervisor's order and its descriptors from ctl.
func receive(ctl *os.File) (o order, files []int, err error) {
	fd := int(ctl.Fd())
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxFiles))
	var n, oobn int
	err = ignoringEINTR(func() (err error) {
		n, oobn, _, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		return err
	})
	if err != nil {
		return o, nil, err
	}
	if n == 0 {
		return o, nil, io.EOF
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil && len(msgs) == 1 {
		files, err = unix.ParseUnixRights(&msgs[0])
	}
	if err != nil || len(files) < 2 {
		return o, files, fmt.Errorf("order without its descriptors (%v)", err)
	}
	// The rest of the message, if one read did not bring it all.
	msg := buf[:n]
	if len(msg) < 4 {
		if msg, err = readMore(ctl, msg, 4); err != nil {
			return o, files, err
		}
	}
	size := int(binary.BigEndian.Uint32(msg))
	if size > maxOrder {
		return o, files, fmt.Errorf("order of %d bytes", size)
	}
	if len(msg) < 4+size {
		if msg, err = readMore(ctl, msg, 4+size); err != nil {
			return o, files, err
		}
	}
	if err := json.Unmarshal(msg[4:4+size], &o); err != nil {
		return o, files, err
	}
	want := 2
	if o.Gated {
		want += 2 + o.Files
	}
	if len(files) != want || o.Files < 0 || !o.Gated && o.Files != 0 {
		return o, files, fmt.Errorf("order with %d descriptors, gated %t with %d files", len(files), o.Gated, o.Files)
	}
	return o, files, nil
}

// readMore reads into msg until it holds want bytes; an error when the
// socket ends first.
func readMore(r io.Reader, msg []byte, want int) ([]byte, error) {
	more := make([]byte, want-len(msg))
	n, err := io.ReadFull(r, more)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return append(msg, more[:n]...), err
}

// Pool keeps supervisors started ahead of the agents they will run, so
// that an agent's start pays for no Go program's start, and takes back a
// supervisor whose agent ended by itself, to run the next: a Go program's
// start takes the CPU of a core for some milliseconds, which every job
// paid even when it was paid ahead. Its Run is Run's; a Run that finds
// none waiting starts one as Run does. A nil Pool keeps none.
//
// A supervisor is not taken back when the runner stopped its agent (a
// signal reached it), or when it exited (it could not start its agent, or
// was killed): a new one is started in its place
// once the run is over, not when it was taken, so that it does not
// compete for a core with the agent starting beside it.
type Pool struct {
	// fwd starts the pool's supervisors in network namespaces of their
	// own; nil, in the runner's.
	fwd   *Forwarding
	ready chan *supervisor
	// room holds a token for each supervisor the pool is to start.
	room   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	// mu orders keep and Close: once closed, a supervisor taken back
	// is ended, not kept where no one would end it.
	mu     sync.Mutex
	closed bool
}

// NewPool keeps ahead supervisors started ahead, and up to keep (at least
// ahead) waiting in all, counting those taken back, until Close. With
// fwd, each is started in a network namespace of its own (Forwarding).
func NewPool(ahead, keep int, fwd *Forwarding) *Pool {
	ahead = max(ahead, 1)
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{fwd: fwd, ready: make(chan *supervisor, max(keep, ahead)), room: make(chan struct{}, ahead), cancel: cancel, done: make(chan struct{})}
	for range ahead {
		p.room <- struct{}{}
	}
	go p.fill(ctx)
	return p
}

// fill starts a supervisor for each token of room. One that cannot start
// is tried again after a second; the job that finds none waiting starts
// its own and reports why it could not.
func (p *Pool) fill(ctx context.Context) {
	defer close(p.done)
	for {
		select {
		case <-p.room:
		case <-ctx.Done():
			return
		}
		for {
			s, err := startSupervisor(p.fwd)
			if err == nil {
				p.keep(s)
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// keep puts s among the waiting supervisors, or ends it when as many
// wait as the pool keeps.
func (p *Pool) keep(s *supervisor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		select {
		case p.ready <- s:
			return
		default:
		}
	}
	s.discard()
}

// Close ends the supervisors still waiting, and stops starting more.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for {
		select {
		case s := <-p.ready:
			s.discard()
		default:
			return
		}
	}
}

// start gives o to a waiting supervisor, or to one started for it when
// none is waiting or the one taken is gone (killed while it waited).
// finish is to be called with it when the run ends. more are the order's
// descriptors after the agent's streams (send).
func (p *Pool) start(o order, stdin, out *os.File, more ...*os.File) (*supervisor, error) {
	var fwd *Forwarding
	if p != nil {
		fwd = p.fwd
		select {
		case s := <-p.ready:
			if err := s.send(o, stdin, out, more...); err == nil {
				return s, nil
			}
			s.kill()
		default:
		}
	}
	if o.Forward != "" && fwd == nil {
		return nil, errors.New("an agent whose network is forwarded needs a pool that starts its supervisors in network namespaces of their own")
	}
	s, err := startSupervisor(fwd)
	if err != nil {
		return nil, err
	}
	if err = s.send(o, stdin, out, more...); err != nil {
		s.kill()
		return nil, fmt.Errorf("telling the agent supervisor what to run: %w", err)
	}
	return s, nil
}

// finish takes s back when its run ended so that it may run another
// agent (again), and otherwise ends it and has a new one started.
func (p *Pool) finish(s *supervisor, again bool) {
	if p == nil {
		s.discard()
		return
	}
	if again {
		p.keep(s)
		return
	}
	s.discard()
	select {
	case p.room <- struct{}{}:
	default:
	}
}
