package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// limitsEnv marks the runner's executable started to set the agent's
// rlimits and exec it; its value is "<data bytes> <nproc>".
const limitsEnv = "ORCH_INTERNAL_AGENT_RLIMITS"

// Limits bound an agent. There is no cgroup v2 path yet (see
// docs/runner.md): they are rlimits, set in a step between init (or the
// supervisor, unconfined) and the agent that sets them on itself and then
// execs the agent, so they hold from the agent's first instruction and
// bind neither the runner nor init. Zero is no limit.
type Limits struct {
	// MemoryMax is RLIMIT_DATA: each process's private writable memory
	// (heap and anonymous mappings; not its address space, which Node
	// reserves far beyond what it uses). It is per process, not the
	// agent's tree in total; an allocation past it fails.
	MemoryMax int64 `json:"memory_max,omitempty"`
	// PidsMax is RLIMIT_NPROC: the kernel counts the processes of the
	// agent's user (within its user namespace and, above it, the
	// runner's user), and does not apply it to root.
	PidsMax int `json:"pids_max,omitempty"`
}

// Set reports whether any limit is set.
func (l Limits) Set() bool { return l.MemoryMax > 0 || l.PidsMax > 0 }

// Wrap is argv under the limits and the variable that carries them: argv
// itself when none is set, else the runner's own executable (self, as
// the process that runs argv names it) in its rlimits step.
func (l Limits) Wrap(self string, argv []string) (wrapped []string, env string) {
	if !l.Set() {
		return argv, ""
	}
	return append([]string{self}, argv...), limitsEnv + "=" + strconv.FormatInt(l.MemoryMax, 10) + " " + strconv.Itoa(l.PidsMax)
}

// command is the agent's command under the limits, from init.
func (l Limits) command(argv, env []string) *exec.Cmd {
	argv, v := l.Wrap("/proc/self/exe", argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	if v != "" {
		cmd.Env = append(cmd.Env, v)
	}
	return cmd
}

// execLimited sets the rlimits of v on this process and execs argv; it
// returns only when it cannot.
func execLimited(v string, argv []string) int {
	f := strings.Fields(v)
	if len(f) != 2 || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "orch: bad rlimits invocation %q %q\n", v, argv)
		return 126
	}
	mem, err1 := strconv.ParseInt(f[0], 10, 64)
	pids, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "orch: bad rlimits %q\n", v)
		return 126
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, limitsEnv+"=") {
			env = append(env, kv)
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "orch: starting agent: %v\n", err)
		return 127
	}
	// The limits last, with nothing left to do but exec: past them,
	// this process allocates no more (a binary built with the race
	// detector, a test's, maps its shadow memory as it goes).
	if mem > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: uint64(mem), Max: uint64(mem)}); err != nil {
			fmt.Fprintf(os.Stderr, "orch: setrlimit RLIMIT_DATA: %v\n", err)
			return 126
		}
	}
	if pids > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: uint64(pids), Max: uint64(pids)}); err != nil {
			fmt.Fprintf(os.Stderr, "orch: setrlimit RLIMIT_NPROC: %v\n", err)
			return 126
		}
	}
	err = syscall.Exec(path, argv, env)
	fmt.Fprintf(os.Stderr, "orch: starting agent: %v\n", err)
	return 127
}
