// Package agent starts the agent CLI for one attempt of a job and watches
// it: its own process group under a per-agent supervisor, its output to a
// log file (through the runner, see output.go), a watchdog, and no process left behind whatever way it ends,
// including a SIGKILL of the runner (see supervisor.go).
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

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
	// Drained, when set, has the agent write into a pipe that the runner
	// drains into LogPath in large writes (see output.go), and is called
	// after each of those writes, so that a reader of the file need not
	// poll. It must not block. When nil, the agent writes LogPath itself.
	Drained func()
	// Timeout is the watchdog; zero means none.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL to the group;
	// zero sends SIGKILL right after SIGTERM. The runner counts the same
	// value in its task lock's staleness, so there is no default here.
	KillGrace time.Duration
	// Notes, when set, carry the runner's own lines into LogPath while
	// the agent runs.
	Notes *Notes
	// Forward is the unix socket that 127.0.0.1:<Forwarding.Port> leads
	// to in the supervisor's network namespace while the agent runs:
	// its job's egress proxy. It needs a Pool made with a Forwarding.
	Forward string
	// Gated says Argv honours a gate (prestart.go): it runs nothing of
	// the agent's before a byte can be read from descriptor GateFD.
	Gated bool
	// Files are given to a Gated command started ahead (Prestart) as
	// descriptors GateFD+1, GateFD+2, ...: the runner's pipe that holds
	// back its sandbox's worktree (sandbox.Job.Later). The caller closes
	// its own once Prestart returns.
	Files []*os.File
	// Started is this spec's agent, started up to its gate by Prestart:
	// Run opens the gate when its order is the one Run would give, and
	// ends it and starts afresh otherwise. Run owns it either way.
	Started *Started
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
	// CPU is the processor time, user and system, that the agent and
	// the processes it waited for used (with the supervisor's own, a few
	// milliseconds).
	CPU time.Duration
}

// Run starts the agent and waits for it. Cancelling ctx stops the whole
// process group: SIGTERM, then SIGKILL after KillGrace. Whatever way the
// agent ends, every process it started is killed and reaped. Its
// supervisor is started for it; Pool.Run takes one started ahead.
func Run(ctx context.Context, s Spec) Result { return (*Pool)(nil).Run(ctx, s) }

// Run is Run, with a supervisor of the pool's when one is waiting.
func (p *Pool) Run(ctx context.Context, s Spec) Result {
	start := time.Now()
	res := p.run(ctx, s)
	res.Duration = time.Since(start)
	return res
}

func (p *Pool) run(ctx context.Context, s Spec) Result {
	o := s.order()
	st := s.Started
	if st != nil && (!st.matches(o) || s.Drained == nil) {
		st.Abort()
		st = nil
	}
	defer func() {
		if st != nil {
			st.Abort() // its gate not opened: nothing of it ran
		}
	}()
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
	if s.Drained != nil {
		defer s.Drained() // the runner's own notes
	}
	// notes is where the runner adds its own lines after the agent's
	// output.
	notes := io.Writer(logf)
	var (
		sup  *supervisor
		outR int
	)
	if st != nil {
		// The task text goes where the agent, not started yet, reads it
		// from: the file's offset, at its start, is shared with it.
		if _, err := st.stdin.WriteAt([]byte(s.Stdin), 0); err != nil {
			fmt.Fprintf(notes, "orch: %v\n", err)
			return Result{ExitCode: -1, Err: fmt.Errorf("writing stdin file: %w", err)}
		}
		st.open()
		sup, outR, st = st.sup, st.outR, nil
	} else if sup, outR, err = p.startNow(s, o, logf); err != nil {
		fmt.Fprintf(notes, "orch: %v\n", err)
		return Result{ExitCode: -1, Err: fmt.Errorf("starting agent: %w", err)}
	}
	again := false
	defer func() { p.finish(sup, again) }()
	if s.Notes != nil {
		s.Notes.attach(logf, s.Drained)
		defer s.Notes.attach(nil, nil)
	}
	var dr *drain
	if outR >= 0 {
		dr = startDrain(outR, logf, s.Drained)
	}
	grace := o.Grace

	done := make(chan ended, 1)
	go func() { done <- sup.await() }()

	var timeout <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(s.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var (
		stopErr error
		e       ended
	)
	select {
	case e = <-done:
	case <-timeout:
		stopErr = fmt.Errorf("%w after %v", ErrTimeout, s.Timeout)
		e = stop(sup, done, grace)
	case <-ctx.Done():
		stopErr = context.Cause(ctx)
		e = stop(sup, done, grace)
	}
	again = e.again && stopErr == nil

	if dr != nil {
		dr.wait(OutputWaitDelay)
	}

	code := -1
	if e.status.Exited() {
		code = e.status.ExitStatus()
	}
	res := Result{ExitCode: code, CPU: e.cpu}
	switch {
	case stopErr != nil:
		fmt.Fprintf(notes, "\norch: agent stopped: %v\n", stopErr)
		res.Err = stopErr
	case code == 127:
		res.Err = fmt.Errorf("agent exited: %w (command not found or not startable, see the log)", &ExitError{e.status})
	case code != 0:
		res.Err = fmt.Errorf("agent exited: %w", &ExitError{e.status})
	}
	return res
}

// ExitError is an agent that exited with a status other than 0, or was
// killed by a signal; its text is exec.ExitError's.
type ExitError struct{ Status syscall.WaitStatus }

func (e *ExitError) Error() string {
	if e.Status.Signaled() {
		return "signal: " + e.Status.Signal().String()
	}
	return "exit status " + strconv.Itoa(e.Status.ExitStatus())
}

// stop asks the supervisor to stop the agent: it sends SIGTERM to the
// agent's group, then SIGKILL after grace. Should the supervisor not be
// done well after that, it is killed, and the agent with it (Pdeathsig).
func stop(s *supervisor, done <-chan ended, grace time.Duration) ended {
	s.signal(syscall.SIGTERM)
	t := time.NewTimer(grace + 5*time.Second)
	defer t.Stop()
	select {
	case e := <-done:
		return e
	case <-t.C:
		s.signal(syscall.SIGKILL)
		return <-done
	}
}
