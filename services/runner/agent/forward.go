package agent

// Supervisors in network namespaces of their own.
//
// Under the allowlist network a confined agent has its own network
// namespace with only a loopback, where 127.0.0.1:<port> leads to its
// job's egress proxy (package sandbox). Something inside that namespace
// must listen there and forward to the proxy's unix socket. A process
// started for each job to do it is a Go program's start on every
// dispatch. Instead, a pool made with a Forwarding starts each of its
// supervisors in a network namespace of its own, the loopback up, and
// the supervisor listens there from its start, off any job's path; while
// an agent runs it forwards to the socket that agent's order names
// (order.Forward), and otherwise closes what it accepts. The agent's
// sandbox then shares the supervisor's namespace instead of making one
// (sandbox.Job.Forwarded).
//
// The namespace holds nothing but the loopback and that listener. A
// supervisor runs one agent at a time, and everything of an agent's is
// gone before its supervisor takes the next order, so no agent meets
// another's connections there. The wrapper that makes the namespace
// (bwrap) stands between the runner and the supervisor: it dies with
// the runner (--die-with-parent) and the supervisor with it, and the
// runner signals the supervisor itself, through a pidfd (supervisor.signal).

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/orch-dev/orch/services/runner/sandbox/initproc"
)

// Forwarding starts supervisors each in a network namespace of its own,
// where they forward a port of the loopback to their agent's socket.
type Forwarding struct {
	// Wrap is the command that runs the program its last argument
	// names in a new network namespace with the loopback up, keeping
	// the runner's files and the descriptors it is given
	// (sandbox.NetnsCommand).
	Wrap []string
	// Port is the port on that loopback where the supervisor listens.
	Port int
}

// forwardEnv marks a supervisor that forwards; its value is the port.
const forwardEnv = "ORCH_INTERNAL_AGENT_FORWARD"

// exeFD is the descriptor of the runner's executable in a wrapped
// supervisor's start: the wrapper runs it as /proc/self/fd/4, so that
// the supervisor is the runner's binary even after an upgrade replaced
// the file, as /proc/self/exe is in the runner's own namespace.
const exeFD = 4

// selfExe is the runner's executable, open for as long as the runner runs.
var selfExe = sync.OnceValues(func() (*os.File, error) { return os.Open("/proc/self/exe") })

// wrap makes cmd, a supervisor's start, that of a supervisor in a
// network namespace of its own that listens on f.Port.
func (f *Forwarding) wrap(cmd *exec.Cmd) error {
	if len(f.Wrap) == 0 || f.Port <= 0 {
		return errors.New("agent supervisors' network namespace: no wrapper or port")
	}
	exe, err := selfExe()
	if err != nil {
		return fmt.Errorf("the runner's executable, for agent supervisors: %w", err)
	}
	cmd.Path = f.Wrap[0]
	cmd.Args = append(append([]string(nil), f.Wrap...), "/proc/self/fd/"+strconv.Itoa(exeFD))
	cmd.Env = append(cmd.Env, forwardEnv+"="+strconv.Itoa(f.Port))
	cmd.ExtraFiles = append(cmd.ExtraFiles, exe) // ctlFD, then exeFD
	return nil
}

// forwardTo is the socket a forwarding supervisor leads its port to now.
var forwardTo atomic.Pointer[string]

// serveForward, in a supervisor, listens on the port forwardEnv names,
// when it names one, and forwards what it accepts to forwardTo.
func serveForward() error {
	v, ok := os.LookupEnv(forwardEnv)
	if !ok {
		return nil
	}
	_ = unix.Close(exeFD) // the executable is running: the agent gets nothing of the runner's
	port, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("bad %s %q", forwardEnv, v)
	}
	ln, err := initproc.Listen(port)
	if err != nil {
		return fmt.Errorf("agent forwarder on 127.0.0.1:%d: %w", port, err)
	}
	go initproc.Forward(ln, func() string {
		if p := forwardTo.Load(); p != nil {
			return *p
		}
		return ""
	})
	return nil
}
