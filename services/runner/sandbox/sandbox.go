// Package sandbox confines an agent with bubblewrap (bwrap): its own user,
// pid, ipc, uts and (unless the network is open) network namespaces, a
// root file system that holds only the system, the agent's program, its
// task's worktree and the parts of the project's clone git needs, a
// private HOME and a private /tmp. Nothing of the runner's (its data
// directory, the other projects' clones, the other tasks' worktrees and
// homes, the host's /proc) is there. Its /etc is a copy of the few host
// files a program needs, only what every user may read, kept current by
// the runner and bound in one mount (Etc).
//
// The process tree of a confined job under the allowlist network, as the
// runner starts it, each started by the one before:
//
//	runner ─ bwrap (NetnsCommand) ─ supervisor (package agent) ─ bwrap ─ bwrap's pid 1 ─ agent
//
// The first bwrap gives the supervisor, started ahead of any job, a
// network namespace of its own with only a loopback, where the
// supervisor listens on 127.0.0.1:ForwardPort and copies each connection
// to its job's egress proxy over a unix socket, which is the agent's only
// way out (agent.Forwarding); the job's sandbox shares that namespace
// (Job.Forwarded). Under the network none or open the supervisor is the
// runner's child, and the sandbox makes no network namespace (open) or
// one of its own (none). bwrap's pid 1 starts the agent itself, or, with
// limits set, the rlimits step, which execs it.
//
// A sandbox started from the host's own network namespace under the
// allowlist (Job without Forwarded) needs a process inside to forward:
// init, orch-sandbox-init (or, where it is not installed, the runner's
// own binary: FindInit), bound read-only into the sandbox and started in
// a marked mode (package initproc), which forwards, starts the agent,
// with its rlimits, as its child and exits with its status: a Go
// program's start on every job. The runner starts sandboxes so only on a
// host where one does not work nested in the supervisor's namespace
// (ProbeNested). When the supervisor kills bwrap, bwrap's pid 1 dies
// (--die-with-parent) and the kernel kills everything left in the pid
// namespace, so the supervisor's no-orphan guarantee holds inside.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Mode is ORCH_AGENT_SANDBOX.
type Mode string

// The modes: auto confines with bwrap when it works on this host and
// runs unconfined (saying so) when it does not; bwrap requires it; none
// runs every agent unconfined.
const (
	ModeAuto  Mode = "auto"
	ModeBwrap Mode = "bwrap"
	ModeNone  Mode = "none"
)

// Network is ORCH_AGENT_NETWORK: what a confined agent may reach.
type Network string

// The networks: allowlist gives the agent only loopback and, over it, the
// runner's egress proxy; open shares the host's network; none gives it
// loopback only.
const (
	NetAllowlist Network = "allowlist"
	NetOpen      Network = "open"
	NetNone      Network = "none"
)

// Valid reports whether m is one of the modes.
func (m Mode) Valid() bool { return m == ModeAuto || m == ModeBwrap || m == ModeNone }

// Valid reports whether n is one of the networks.
func (n Network) Valid() bool { return n == NetAllowlist || n == NetOpen || n == NetNone }

// probeTimeout bounds the start-up trial of bwrap: a host where it hangs
// cannot confine either.
const probeTimeout = 20 * time.Second

// probeWaitDelay bounds how long a probe waits for its output once bwrap
// has ended (or been killed at probeTimeout): a process bwrap left
// behind can hold the output's pipe open, and a start-up must not wait
// for it (exec.Cmd.WaitDelay).
const probeWaitDelay = 2 * time.Second

// Choose decides at start how agents run under mode: the path of bwrap
// when they are confined, "" when not. init is the program FindInit
// chose, which the probe runs inside a sandbox as a job would. For auto, a host
// where bwrap does not work gives "" and the reason in warn; for bwrap it
// is the error, naming the problem.
func Choose(ctx context.Context, mode Mode, init string) (bwrap, warn string, err error) {
	if mode == ModeNone {
		return "", "", nil
	}
	path, perr := Probe(ctx, init)
	switch {
	case perr == nil:
		return path, "", nil
	case mode == ModeBwrap:
		return "", "", fmt.Errorf("ORCH_AGENT_SANDBOX=bwrap: cannot confine agents: %w", perr)
	default:
		return "", perr.Error(), nil
	}
}

// Probe tries bwrap the way a job uses it: every namespace unshared, and
// init (FindInit's) run inside in its probe mode. It returns
// bwrap's path, or why it does not work, with bwrap's own words.
func Probe(ctx context.Context, init string) (string, error) {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return "", errors.New("bwrap (bubblewrap) is not on PATH: install it (Debian: apt-get install bubblewrap) or set ORCH_AGENT_SANDBOX=none")
	}
	if _, err := os.Stat(init); err != nil {
		return "", fmt.Errorf("the init program, which runs in every sandbox: %w", err)
	}
	out, err := probeRun(ctx, path, probeArgs(NetAllowlist, init)...)
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("bwrap does not work on this host: %s (user namespaces disabled or blocked? see docs/runner.md)", msg)
	}
	if strings.TrimSpace(string(out)) != probeAnswer {
		return "", fmt.Errorf("bwrap ran, but the init program inside answered %q", strings.TrimSpace(string(out)))
	}
	return path, nil
}

// probeRun runs a trial, bwrap with args, within probeTimeout, and
// returns its output and error: at most probeWaitDelay later once bwrap
// has ended, whatever it left holding the output.
func probeRun(ctx context.Context, bwrap string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bwrap, args...)
	cmd.WaitDelay = probeWaitDelay
	return cmd.CombinedOutput()
}

// probeArgs are bwrap's arguments for a trial sandbox under network n
// (NetOpen: the starter's own) that runs init in its probe mode.
func probeArgs(n Network, init string) []string {
	args := append(namespaceArgs(n), systemArgs("")...)
	return append(args, "--ro-bind", init, InitPath, "--setenv", initEnv, probeValue, "--", InitPath)
}

// ProbeNested tries a job's sandbox started from NetnsCommand's network
// namespace (Job.Forwarded), with init run inside in its probe mode as
// Probe does: bwrap within bwrap's user namespace, which a host may
// refuse (a low user.max_user_namespaces, a security module) where one
// level works. The error says why, with bwrap's own words.
func ProbeNested(ctx context.Context, bwrap, init string) error {
	args := append(NetnsCommand(bwrap)[1:], bwrap)
	out, err := probeRun(ctx, bwrap, append(args, probeArgs(NetOpen, init)...)...)
	if answer := strings.TrimSpace(string(out)); err != nil || answer != probeAnswer {
		if answer == "" && err != nil {
			answer = err.Error()
		}
		return fmt.Errorf("a sandbox within a network namespace of bwrap's does not work on this host: %s", answer)
	}
	return nil
}

// Floor is the least bwrap command that confines argv as a job's sandbox
// does: the same namespaces (the network none), the host's root bound
// read-only, the worktree (its working directory) and the paths in rw
// writable. It is no
// sandbox (the host's files are all there to read): benchmarks use it as
// the floor under a confined start, what any sandbox made with bwrap for
// each job costs.
func Floor(bwrap, worktree string, rw []string, argv ...string) []string {
	args := append([]string{bwrap}, namespaceArgs(NetNone)...)
	args = append(args, "--ro-bind", "/", "/")
	for _, p := range append([]string{worktree}, rw...) {
		args = append(args, "--bind", p, p)
	}
	args = append(args, "--chdir", worktree, "--")
	return append(args, argv...)
}

// NetnsCommand is the command that runs its last argument, a program to
// append, in a network namespace of its own with the loopback up, and
// nothing else changed: the same files (the host's root bound whole,
// devices too), the same processes, descriptors and environment. A
// user namespace comes with it, as bwrap needs one to make the network
// namespace unprivileged, with the same user; the sandboxes started
// from there nest in it. Package agent starts supervisors so under the
// allowlist (agent.Forwarding), and jobs' sandboxes share their network
// (Job.Forwarded).
func NetnsCommand(bwrap string) []string {
	return []string{bwrap, "--unshare-user", "--unshare-net", "--die-with-parent", "--dev-bind", "/", "/", "--"}
}

// namespaceArgs are the namespaces and process settings of every sandbox.
func namespaceArgs(n Network) []string {
	args := []string{
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		// No user namespace inside: less of the kernel within reach.
		"--disable-userns",
		"--die-with-parent",
		"--hostname", "orch-agent",
	}
	if n != NetOpen {
		// bwrap brings lo up in a new network namespace.
		args = append(args, "--unshare-net")
	}
	return args
}
