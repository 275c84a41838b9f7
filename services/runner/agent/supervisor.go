package agent

// Orphan prevention.
//
// The agent must never outlive the runner, whatever way the runner ends,
// and that includes everything the agent started. Linux offers two parts of
// an answer, neither enough alone:
//
//   - Pdeathsig is delivered to the direct child only. A grandchild (the
//     shell the agent runs, the test runner it starts) is not told.
//   - A process group reaches every descendant that stays in the group, but
//     someone has to send the signal, and a SIGKILLed runner sends nothing.
//     A descendant that calls setsid(2) leaves the group altogether.
//
// So the runner does not start the agent itself. It re-executes its own
// binary (/proc/self/exe, which works even when the file on disk has been
// replaced by an upgrade) as a tiny per-agent supervisor, marked by the
// environment variable supervisorEnv, which this package's init function
// recognises before main runs; any binary that links this package (the
// runner, the local all-in-one, a test binary) is therefore a supervisor
// too, with no hook to forget. It is started ahead of its agent and told
// what to run over its control socket (warm.go). The supervisor:
//
//   - is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so descendants
//     orphaned by the agent, including those that left the group with
//     setsid, are re-parented to it rather than to init, where it can still
//     find and kill them;
//   - starts the agent in a new process group with Pdeathsig SIGKILL, so the
//     agent dies if the supervisor itself is killed;
//   - holds one end of a socket whose other end only the runner holds.
//     When the runner dies in any way, including SIGKILL, the kernel
//     closes that end and the supervisor reads EOF: it SIGKILLs the agent's
//     group and every process re-parented to it, and exits. The supervisor
//     also has Pdeathsig SIGTERM as a second, independent signal of the
//     runner's death;
//   - on SIGTERM (the runner's watchdog, cancel or shutdown) sends SIGTERM to
//     the agent's group, then SIGKILL after the grace it was given;
//   - whenever the agent ends, kills what it left behind, then reports the
//     agent's wait status and CPU time on the socket and waits for its next
//     order (warm.go); once a signal has reached it, it exits with the
//     agent's exit status instead (re-raising the signal that killed it),
//     so the runner sees the agent's own result either way.
//
// A subreaper runner alone would not do: when the runner is SIGKILLed its
// subreaped descendants go to init and live on. A process that survives
// the runner is needed, and the smallest such process is this one.
//
// The cost is one extra small process per running agent, and the idle
// ones the runner keeps for the next.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// supervisorEnv marks a process started as an agent supervisor; its value
// does not matter. It is the only variable of a supervisor's own
// environment: the agent's comes with its order (warm.go).
const supervisorEnv = "ORCH_INTERNAL_AGENT_SUPERVISOR"

// supervisorName is the supervisor's argv[0], as ps shows it.
const supervisorName = "orch-agent-supervisor"

// supervisorComm is the supervisor's process name (comm, at most 15
// bytes), as ps -e, top and pgrep show it. A supervisor started in a
// network namespace of its own (Forwarding) is run as /proc/self/fd/4,
// which its argv keeps (bwrap 0.8 has no --argv0): its name says what it
// is all the same.
const supervisorComm = "orch-supervisor"

// ctlFD is the descriptor of the control socket from the runner: the
// order comes on it, and its end of file means the runner is gone.
const ctlFD = 3

func init() {
	if _, ok := os.LookupEnv(supervisorEnv); !ok {
		return
	}
	// init runs on the main goroutine locked to the main thread, and os.Exit
	// ends the process before it could be unlocked: the agent's Pdeathsig,
	// which is bound to the thread that started it, fires only when the
	// supervisor really dies.
	os.Exit(supervise())
}

// supervise runs the agents it is ordered to, one after another, and
// returns the supervisor's exit code. After each agent it reports how the
// agent ended on its control socket (see result) and waits for its next
// order; it exits instead once a signal has reached it, or when the
// runner is gone or closes the socket.
func supervise() int {
	syscall.CloseOnExec(ctlFD) // the agent must not hold the runner's socket
	if name, err := unix.BytePtrFromString(supervisorComm); err == nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
	}
	ctl := os.NewFile(ctlFD, "orch-ctl")
	if err := serveForward(); err != nil {
		fmt.Fprintf(os.Stderr, "orch: %v\n", err)
		return 126
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "orch: prctl(PR_SET_CHILD_SUBREAPER): %v\n", err)
	}
	watch, err := newGoneWatch(ctl)
	if err != nil {
		fmt.Fprintf(os.Stderr, "orch: %v\n", err)
		return 126
	}
	sigs := relaySignals()
	for {
		// Waiting, the main thread reads the next order itself: the
		// order's arrival wakes the one thread that starts the agent.
		// A signal meanwhile ends the supervisor (relaySignals), as
		// one with nothing to run should end; so does one that reached
		// the last run after it ended.
		supervisorState.Store(stateWaiting)
		select {
		case <-sigs:
			return 0
		default:
		}
		o, files, err := receive(ctl)
		if errors.Is(err, io.EOF) && len(files) == 0 {
			return 0 // the runner is gone, or needs no agent of this one
		}
		if !supervisorState.CompareAndSwap(stateWaiting, stateRunning) {
			return 0 // a signal came first: the order is not taken
		}
		ws, cpu, code, again := runOrder(ctl, o, files, err, sigs, watch)
		switch {
		case code >= 0:
			return code
		case again:
			if _, err := ctl.Write(result(ws, cpu, true)); err != nil {
				return 0 // the runner is gone
			}
			continue
		}
		_, _ = ctl.Write(result(ws, cpu, false))
		if ws.Signaled() {
			// Die of the same signal, so the runner sees what the agent
			// got.
			signal.Reset()
			_ = syscall.Kill(os.Getpid(), ws.Signal())
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// A supervisor's state, for relaySignals: waiting for an order, running
// one (from its taking to the report of how it ended), or exiting.
const (
	stateWaiting = iota
	stateRunning
	stateExiting
)

var supervisorState atomic.Int32

// relaySignals passes on the signals a run is to act on (SIGTERM, SIGINT,
// SIGHUP): while an order runs, into the channel returned; while the
// supervisor waits for one, it exits instead. The main thread, blocked
// reading its order, could not see them there.
func relaySignals() <-chan os.Signal {
	in, out := make(chan os.Signal, 4), make(chan os.Signal, 4)
	signal.Notify(in, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range in {
			if supervisorState.CompareAndSwap(stateWaiting, stateExiting) {
				os.Exit(0)
			}
			out <- sig
		}
	}()
	return out
}

// goneWatch tells, while an agent runs, when the runner is gone: the
// runner sends nothing on the control socket then, so its end of file
// (the peer's hang-up) is the runner's death. It polls the socket without
// reading it, so the next order stays there for the main thread.
type goneWatch struct {
	ctl int
	// wakeR and wakeW are a pipe that stop writes to end the poll.
	wakeR, wakeW int
	done         chan struct{}
}

func newGoneWatch(ctl *os.File) (*goneWatch, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("creating the watch's pipe: %w", err)
	}
	return &goneWatch{ctl: int(ctl.Fd()), wakeR: p[0], wakeW: p[1]}, nil
}

// start watches until stop; the channel is closed when the runner is
// gone.
func (w *goneWatch) start() <-chan struct{} {
	gone := make(chan struct{})
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		fds := []unix.PollFd{{Fd: int32(w.ctl), Events: unix.POLLIN | unix.POLLRDHUP}, {Fd: int32(w.wakeR), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				return
			}
			switch {
			case fds[1].Revents != 0:
				var b [1]byte
				_, _ = unix.Read(w.wakeR, b[:])
				return
			case fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0:
				close(gone)
				return
			case fds[0].Revents&unix.POLLIN != 0:
				// Bytes where none were due: the main thread reads them
				// once this run is over.
				return
			}
		}
	}()
	return gone
}

// stop ends the watch and waits for it.
func (w *goneWatch) stop() {
	_, _ = unix.Write(w.wakeW, []byte{0})
	<-w.done
	// A watch that ended by itself left the byte unread.
	var b [1]byte
	_, _ = unix.Read(w.wakeR, b[:])
}

// runOrder runs the agent of one order, as receive read it (with its
// descriptors, or the error reading it), and cleans up after it. It returns
// how the agent ended and the CPU time of what ran, and whether the
// supervisor may take another order (no signal reached it); or an exit
// code >= 0 when the supervisor is to exit at once.
func runOrder(ctl *os.File, o order, files []int, err error, sigs <-chan os.Signal, watch *goneWatch) (ws syscall.WaitStatus, cpu time.Duration, code int, again bool) {
	if len(files) >= 2 {
		// The agent's standard streams are the supervisor's while it
		// runs, so that its own words reach the job's log too.
		_ = unix.Dup3(files[0], 0, 0)
		_ = unix.Dup3(files[1], 1, 0)
		_ = unix.Dup3(files[1], 2, 0)
		_ = unix.Close(files[0])
		_ = unix.Close(files[1])
	}
	// A gate's read end goes to the command; its write end stays here
	// until the agent has ended, so that the runner's death cannot open
	// the gate: only the runner's byte does.
	// The files after it go to the command too, from GateFD+1 on.
	var gateR, gateW *os.File
	var extra []*os.File
	if o.Gated && len(files) >= 4 {
		gateR, gateW = os.NewFile(uintptr(files[2]), "orch-gate"), os.NewFile(uintptr(files[3]), "orch-gate")
		defer gateW.Close()
		defer gateR.Close()
		for _, fd := range files[4:] {
			f := os.NewFile(uintptr(fd), "orch-file")
			defer f.Close()
			extra = append(extra, f)
		}
	}
	if err != nil || len(o.Argv) == 0 {
		fmt.Fprintf(os.Stderr, "orch: bad supervisor order %+v: %v\n", o, err)
		return 0, 0, 126, false
	}
	// Taken: the runner waits for this answer before it counts on this
	// supervisor (see supervisor.send).
	if _, err := ctl.Write(binary.BigEndian.AppendUint32([]byte{orderTaken}, uint32(os.Getpid()))); err != nil {
		return 0, 0, 0, false // the runner is gone
	}
	defer forget()
	forwardTo.Store(&o.Forward)
	defer forwardTo.Store(nil)

	// The agent's directory and environment become the supervisor's
	// too, so that its program is looked up as the agent's own shell
	// would (PATH, a path relative to the directory).
	if err := os.Chdir(o.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "orch: starting agent: %v\n", err)
		return 0, 0, 127, false
	}
	os.Clearenv()
	for _, kv := range o.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			_ = os.Setenv(k, v)
		}
	}
	before := cpuUsed()
	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	cmd.Env = o.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if gateR != nil {
		cmd.ExtraFiles = append([]*os.File{gateR}, extra...) // GateFD, then the files
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "orch: starting agent: %v\n", err)
		return 0, 0, 127, false
	}
	if gateR != nil {
		_ = gateR.Close()
		for _, f := range extra {
			_ = f.Close()
		}
	}
	pgid := cmd.Process.Pid
	// Watched from here on, not before the agent's start, which it would
	// delay (a thread to wake); a runner gone meanwhile is seen at once.
	gone := watch.start()
	defer watch.stop()

	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	signalled, runnerGone := false, false
	select {
	case <-done:
	case <-gone:
		runnerGone = true
	case <-sigs:
		signalled = true
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(o.Grace)
		select {
		case <-done:
		case <-gone:
			runnerGone = true
		case <-t.C:
		}
		t.Stop()
	}
	// Whatever is left goes: first the agent's group (which ends the
	// agent, reaped by cmd.Wait), then whatever was re-parented to us.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-done
	sweep(pgid)
	if runnerGone {
		return 0, 0, 0, false
	}
	ws, _ = cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ws, cpuUsed() - before, -1, !signalled
}

// forget leaves nothing of the last agent's in the supervisor: its
// standard streams back on /dev/null (the runner reads the end of the
// agent's output from the pipe once nobody holds it), its directory and
// environment its own again.
func forget() {
	if null, err := unix.Open(os.DevNull, unix.O_RDWR, 0); err == nil {
		for fd := range 3 {
			_ = unix.Dup3(null, fd, 0)
		}
		_ = unix.Close(null)
	}
	_ = os.Chdir("/")
	os.Clearenv()
	_ = os.Setenv(supervisorEnv, "1")
}

// cpuUsed is the CPU time, user and system, of the supervisor and of the
// children it has reaped.
func cpuUsed() time.Duration {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	d := func(tv syscall.Timeval) time.Duration { return time.Duration(tv.Nano()) }
	return d(self.Utime) + d(self.Stime) + d(children.Utime) + d(children.Stime)
}

// result is the message in which a supervisor reports how its agent
// ended: resultTag, the wait status, the CPU time in nanoseconds, and
// whether the supervisor takes another order (1) or exits (0).
func result(ws syscall.WaitStatus, cpu time.Duration, again bool) []byte {
	msg := []byte{resultTag}
	msg = binary.BigEndian.AppendUint32(msg, uint32(ws))
	msg = binary.BigEndian.AppendUint64(msg, uint64(cpu))
	if again {
		return append(msg, 1)
	}
	return append(msg, 0)
}

// resultTag starts a result message; resultLen is its length.
const (
	resultTag = 2
	resultLen = 1 + 4 + 8 + 1
)

// sweep kills the agent's group and every child of this process, and reaps
// them, until no child is left. A killed descendant's own children are
// re-parented to this subreaper, so the loop reaches the whole tree.
func sweep(pgid int) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		// Most agents leave nothing behind: then there is no child to
		// wait for, and no need to read the whole of /proc.
		if !reapAll() {
			return
		}
		for _, pid := range children(os.Getpid()) {
			_ = syscall.Kill(-pid, syscall.SIGKILL) // its group, if it leads one
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !reapAll() || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reapAll reaps every child that has ended and reports whether any child
// is left.
func reapAll() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.ECHILD) {
			return false
		}
		if pid <= 0 || err != nil {
			return true
		}
	}
}

// children lists the processes whose parent is ppid, from /proc.
func children(ppid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := parentOf(pid); ok && p == ppid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parentOf reads the parent pid of pid from /proc/<pid>/stat.
func parentOf(pid int) (int, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name is in parentheses and may hold anything; the
	// fields after the last ')' are: state ppid ...
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	p, err := strconv.Atoi(f[1])
	return p, err == nil
}

// Alive reports whether pid is a live process: it exists and is not a
// zombie waiting to be reaped.
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}
