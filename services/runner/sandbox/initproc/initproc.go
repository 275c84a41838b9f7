// Package initproc holds the two steps of a confined agent's start that
// run as an executable of orch's own, re-executed: a sandbox's init and
// the rlimits step (package sandbox says what each does). They are
// recognised in this package's init function, before main runs, by any
// binary that links it: the runner's, and orch-sandbox-init
// (cmd/orch-sandbox-init), a program of this package alone, which the
// runner runs instead of itself when it finds it (sandbox.FindInit).
//
// A Go program starts by initialising every package it links. The
// runner's executable in init's mode takes about 15 ms of wall clock on
// a 2-core VM, most of it the runtime's start over a 22 MB binary and
// the 67 packages that Go initialises before this one (in each step the
// first ready package in import-path order, and compress/, crypto/,
// encoding/ and github.com/[a-n] sort before github.com/orch-dev);
// orch-sandbox-init, 1.7 MB, about 6.4 ms, an empty Go program 5.6 ms
// (`perf stat -r 300`, probe mode). The package imports only a few of
// the standard library's packages (not fmt, encoding/json, os/exec, net
// or golang.org/x/sys: with fmt and encoding/json orch-sandbox-init took
// 7.3 ms), which also keeps the runner's own executable in init's mode
// from waiting for the rest of the runner's packages.
package initproc

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// InitEnv marks orch-sandbox-init (or the runner's executable) started as
// a sandbox's init; its value is the Spec (Spec.String), or ProbeValue.
const InitEnv = "ORCH_INTERNAL_SANDBOX_INIT"

// LimitsEnv marks orch-sandbox-init (or the runner's executable) started
// to set the agent's rlimits and exec it; its value is "<data bytes> <nproc>".
const LimitsEnv = "ORCH_INTERNAL_AGENT_RLIMITS"

// The probe's exchange with init. The answer names the revision of what
// the runner hands init (InitEnv's Spec, argv, LimitsEnv): a change to
// any of them counts it up, so that a runner finds out at start that an
// init executable of its own (cmd/orch-sandbox-init) was built from
// another revision, instead of in every job.
const (
	ProbeValue  = "probe"
	ProbeAnswer = "orch-sandbox-ok 2"
)

// Spec is what init is to do besides starting the agent.
type Spec struct {
	// Port and Socket: forward each connection to 127.0.0.1:Port to
	// the unix socket Socket. Zero, no forwarder.
	Port   int
	Socket string
	// Limits go on the agent.
	Limits Limits
}

// String is s as InitEnv carries it: "<port> <memory max> <pids max>
// <socket>", the socket last, as it is, so that it may hold any byte
// but NUL. Not JSON: encoding/json and fmt would add a tenth to init's
// start.
func (s Spec) String() string {
	return strconv.Itoa(s.Port) + " " + strconv.FormatInt(s.Limits.MemoryMax, 10) + " " + strconv.Itoa(s.Limits.PidsMax) + " " + s.Socket
}

// ParseSpec reads what Spec.String wrote.
func ParseSpec(v string) (Spec, error) {
	f := strings.SplitN(v, " ", 4)
	if len(f) != 4 {
		return Spec{}, errors.New("want 4 fields")
	}
	port, err1 := strconv.Atoi(f[0])
	mem, err2 := strconv.ParseInt(f[1], 10, 64)
	pids, err3 := strconv.Atoi(f[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return Spec{}, err
	}
	return Spec{Port: port, Socket: f[3], Limits: Limits{MemoryMax: mem, PidsMax: pids}}, nil
}

// say writes "orch: " and parts as a line to stderr, which is the
// agent's log.
func say(parts ...string) {
	_, _ = os.Stderr.WriteString("orch: " + strings.Join(parts, "") + "\n")
}

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
	MemoryMax int64
	// PidsMax is RLIMIT_NPROC: the kernel counts the processes of the
	// agent's user (within its user namespace and, above it, the
	// runner's user), and does not apply it to root.
	PidsMax int
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
	return append([]string{self}, argv...), LimitsEnv + "=" + strconv.FormatInt(l.MemoryMax, 10) + " " + strconv.Itoa(l.PidsMax)
}

func init() {
	if v, ok := os.LookupEnv(InitEnv); ok {
		// Straight to exit(2): init has nothing to flush, and a binary
		// built with the race detector (a test's) would spend a second
		// in os.Exit's hooks on every job.
		syscall.Exit(runInit(v, os.Args[1:]))
	}
	// (A supervisor of package agent starts with nothing but its own
	// mark in its environment; the agent's, LimitsEnv among it, comes
	// later, for the process it starts: the rlimits step.)
	if v, ok := os.LookupEnv(LimitsEnv); ok {
		os.Exit(execLimited(v, os.Args[1:]))
	}
}
