package initproc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// rlimitNproc is RLIMIT_NPROC on Linux, which package syscall does not
// name (golang.org/x/sys/unix would order this package late, see the
// package's comment).
const rlimitNproc = 6

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
		if !strings.HasPrefix(kv, LimitsEnv+"=") {
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
		if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: uint64(mem), Max: uint64(mem)}); err != nil {
			fmt.Fprintf(os.Stderr, "orch: setrlimit RLIMIT_DATA: %v\n", err)
			return 126
		}
	}
	if pids > 0 {
		if err := syscall.Setrlimit(rlimitNproc, &syscall.Rlimit{Cur: uint64(pids), Max: uint64(pids)}); err != nil {
			fmt.Fprintf(os.Stderr, "orch: setrlimit RLIMIT_NPROC: %v\n", err)
			return 126
		}
	}
	err = syscall.Exec(path, argv, env)
	fmt.Fprintf(os.Stderr, "orch: starting agent: %v\n", err)
	return 127
}
