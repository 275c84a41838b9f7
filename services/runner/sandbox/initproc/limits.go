package initproc

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// rlimitNproc is RLIMIT_NPROC on Linux, which package syscall does not
// name (golang.org/x/sys/unix would order this package late, see the
// package's comment).
const rlimitNproc = 6

// lookPath finds name on this process's PATH as os/exec's LookPath
// would (only absolute directories): os/exec would order this package's
// initialisation after most of the runner's (see the package's comment).
func lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
		if !strings.HasPrefix(dir, "/") {
			continue
		}
		p := strings.TrimSuffix(dir, "/") + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("exec: " + strconv.Quote(name) + ": executable file not found in $PATH")
}

// execLimited sets the rlimits of v on this process and execs argv; it
// returns only when it cannot.
func execLimited(v string, argv []string) int {
	f := strings.Fields(v)
	if len(f) != 2 || len(argv) == 0 {
		say("bad rlimits invocation ", strconv.Quote(v), " ", strconv.Quote(strings.Join(argv, " ")))
		return 126
	}
	mem, err1 := strconv.ParseInt(f[0], 10, 64)
	pids, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		say("bad rlimits ", strconv.Quote(v))
		return 126
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, LimitsEnv+"=") {
			env = append(env, kv)
		}
	}
	path, err := lookPath(argv[0])
	if err != nil {
		say("starting agent: ", err.Error())
		return 127
	}
	// The limits last, with nothing left to do but exec: past them,
	// this process allocates no more (a binary built with the race
	// detector, a test's, maps its shadow memory as it goes).
	if mem > 0 {
		if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: uint64(mem), Max: uint64(mem)}); err != nil {
			say("setrlimit RLIMIT_DATA: ", err.Error())
			return 126
		}
	}
	if pids > 0 {
		if err := syscall.Setrlimit(rlimitNproc, &syscall.Rlimit{Cur: uint64(pids), Max: uint64(pids)}); err != nil {
			say("setrlimit RLIMIT_NPROC: ", err.Error())
			return 126
		}
	}
	err = syscall.Exec(path, argv, env)
	say("starting agent: ", err.Error())
	return 127
}
