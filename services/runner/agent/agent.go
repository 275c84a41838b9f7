// Package agent starts the agent CLI for one attempt of a job and watches
// it: its own process group, its output to a log file, a watchdog, and
// no process left behind whatever way it ends.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// KillGraceDefault is how long the agent's group has between SIGTERM and
// SIGKILL.
const KillGraceDefault = 5 * time.Second

// ErrTimeout is the error of an agent stopped by the watchdog.
var ErrTimeout = errors.New("timeout")

// Spec is one run of the agent.
type Spec struct {
	// Argv is the command and its arguments; never run through a shell.
	Argv []string
	// Dir is the working directory: the task's worktree.
	Dir string
	// Env is the whole environment of the agent.
	Env []string
	// Stdin is written to the agent's standard input (the task text).
	Stdin string
	// LogPath receives stdout and stderr; its directory is created.
	LogPath string
	// Timeout is the watchdog; zero means none.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL to the group.
	// Zero means KillGraceDefault.
	KillGrace time.Duration
}

// Result is how a run ended.
type Result struct {
	// ExitCode is the agent's exit status; -1 when it was killed by a
	// signal or could not start.
	ExitCode int
	// Err is nil on exit 0. It wraps ErrTimeout when the watchdog fired,
	// and the context's error when ctx ended the run.
	Err      error
	Duration time.Duration
}

// Run starts the agent and waits for it. Cancelling ctx stops the whole
// process group: SIGTERM, then SIGKILL after KillGrace.
func Run(ctx context.Context, s Spec) Result {
	start := time.Now()
	res := run(ctx, s)
	res.Duration = time.Since(start)
	return res
}

func run(ctx context.Context, s Spec) Result {
	if len(s.Argv) == 0 {
		return Result{ExitCode: -1, Err: errors.New("empty agent command")}
	}
	if err := os.MkdirAll(filepath.Dir(s.LogPath), 0o755); err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("creating log dir: %w", err)}
	}
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("opening log: %w", err)}
	}
	defer logf.Close()

	cmd := exec.Command(s.Argv[0], s.Argv[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = s.Env
	cmd.Stdin = strings.NewReader(s.Stdin)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own group, so the watchdog reaches its children too.
		Setpgid: true,
		// The agent dies with the runner, even on SIGKILL.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(logf, "orch: starting agent: %v\n", err)
		return Result{ExitCode: -1, Err: fmt.Errorf("starting agent: %w", err)}
	}
	pgid := cmd.Process.Pid

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var timeout <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(s.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var stopErr error
	var waitErr error
	select {
	case waitErr = <-done:
	case <-timeout:
		stopErr = fmt.Errorf("%w after %v", ErrTimeout, s.Timeout)
		waitErr = stop(pgid, done, cmp.Or(s.KillGrace, KillGraceDefault))
	case <-ctx.Done():
		stopErr = context.Cause(ctx)
		waitErr = stop(pgid, done, cmp.Or(s.KillGrace, KillGraceDefault))
	}
	// Whatever the agent left running in its group goes with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)

	code := cmd.ProcessState.ExitCode()
	switch {
	case stopErr != nil:
		fmt.Fprintf(logf, "\norch: agent stopped: %v\n", stopErr)
		return Result{ExitCode: code, Err: stopErr}
	case waitErr != nil:
		return Result{ExitCode: code, Err: fmt.Errorf("agent exited: %w", waitErr)}
	}
	return Result{ExitCode: 0}
}

// stop sends SIGTERM to the group, then SIGKILL after grace, and returns
// the leader's wait error.
func stop(pgid int, done <-chan error, grace time.Duration) error {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return <-done
	}
}
