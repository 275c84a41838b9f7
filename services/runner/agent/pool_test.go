package agent_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// poolOwnerEnv makes the test binary a process that keeps a pool of
// supervisors and waits to be killed (poolOwner).
const poolOwnerEnv = "ORCH_TEST_POOL_OWNER"

// poolOwner keeps a pool of two waiting supervisors, says so on stdout
// and waits for its end. With poolOwnerEnv "forward", its supervisors
// are in network namespaces of their own.
func poolOwner() {
	var fwd *agent.Forwarding
	if os.Getenv(poolOwnerEnv) == "forward" {
		bwrap, _ := exec.LookPath("bwrap")
		fwd = &agent.Forwarding{Wrap: sandbox.NetnsCommand(bwrap), Port: 3128}
	}
	p := agent.NewPool(2, 2, fwd)
	defer p.Close()
	fmt.Println("ready")
	select {}
}

// supervisorsOf lists the supervisors whose parent is ppid, or, started
// in a network namespace of their own, whose wrapper's parent is.
func supervisorsOf(ppid int) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		parent := parentOf(pid)
		switch {
		case strings.HasPrefix(string(cmdline), "orch-agent-supervisor\x00") && parent == ppid:
		case strings.HasPrefix(string(cmdline), "/proc/self/fd/4\x00") && parentOf(parent) == ppid:
		default:
			continue
		}
		if agent.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parentOf is pid's parent, or -1.
func parentOf(pid int) int {
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(stat)[i+1:])
	if len(f) < 2 {
		return -1
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return ppid
}

// Agents run through supervisors started ahead, one after another and
// several at once, each with its own directory, environment, input and
// output; Close leaves no supervisor behind.
func TestPoolRunsAgents(t *testing.T) {
	p := agent.NewPool(2, 2, nil)
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if n := len(supervisorsOf(os.Getpid())); n != 2 {
			return fmt.Errorf("%d supervisors waiting, want 2", n)
		}
		return nil
	})
	dir := t.TempDir()
	argv := script(t, dir, `read line; echo "$line in $(pwd) with $ORCH_N"; echo err >&2; exit $ORCH_N`)
	results := make(chan error, 5)
	for n := range 5 {
		go func() {
			s := spec(t, argv)
			s.Stdin = fmt.Sprintf("task %d\n", n)
			s.Env = append(s.Env, "ORCH_N="+strconv.Itoa(n))
			res := p.Run(context.Background(), s)
			log, _ := os.ReadFile(s.LogPath)
			want := fmt.Sprintf("task %d in %s with %d\nerr\n", n, s.Dir, n)
			switch {
			case res.ExitCode != n:
				results <- fmt.Errorf("run %d: %+v, want exit %d", n, res, n)
			case string(log) != want:
				results <- fmt.Errorf("run %d: log %q, want %q", n, log, want)
			default:
				results <- nil
			}
		}()
	}
	for range 5 {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
	p.Close()
	if left := supervisorsOf(os.Getpid()); len(left) > 0 {
		t.Errorf("supervisors %v left after Close", left)
	}
}

// A supervisor still waiting for its agent ends with its runner, even a
// SIGKILLed one; started in a network namespace of its own too.
func TestPoolEndsWithItsOwner(t *testing.T) {
	t.Run("own", func(t *testing.T) { testPoolEndsWithItsOwner(t, "own") })
	t.Run("forward", func(t *testing.T) {
		testkit.RequireBwrap(t)
		testPoolEndsWithItsOwner(t, "forward")
	})
}

// startOwner starts the test binary as a process that owns supervisors
// (kv in its environment makes it one: see TestMain) and returns once it
// says it is ready.
func startOwner(t *testing.T, kv string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), kv)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the owner (%s) said %q, %v", kv, line, err)
	}
	return cmd
}

func testPoolEndsWithItsOwner(t *testing.T, mode string) {
	cmd := startOwner(t, poolOwnerEnv+"="+mode)
	var waiting []int
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if waiting = supervisorsOf(cmd.Process.Pid); len(waiting) != 2 {
			return fmt.Errorf("%d supervisors waiting, want 2", len(waiting))
		}
		return nil
	})
	// Each is named so in ps -e and top, wrapped or not.
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		for _, pid := range waiting {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); string(comm) != "orch-supervisor\n" {
				return fmt.Errorf("supervisor %d is named %q", pid, comm)
			}
		}
		return nil
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	testkit.WaitGone(t, agent.Alive, waiting...)
}

// A supervisor killed while it waited (the OOM killer, a person) costs
// its job nothing: the job starts a supervisor of its own. One sent
// SIGTERM while it waits ends at once: it has nothing to stop.
func TestPoolSupervisorKilledWhileWaiting(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) { testPoolSupervisorKilledWhileWaiting(t, sig) })
	}
}

func testPoolSupervisorKilledWhileWaiting(t *testing.T, sig syscall.Signal) {
	p := agent.NewPool(1, 1, nil)
	defer p.Close()
	var waiting []int
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if waiting = supervisorsOf(os.Getpid()); len(waiting) != 1 {
			return fmt.Errorf("%d supervisors waiting, want 1", len(waiting))
		}
		return nil
	})
	_ = syscall.Kill(waiting[0], sig)
	testkit.WaitGone(t, agent.Alive, waiting...)
	s := spec(t, script(t, t.TempDir(), "echo ran\n"))
	if res := p.Run(context.Background(), s); res.Err != nil {
		t.Fatalf("run after its supervisor was killed: %+v", res)
	}
	if log, _ := os.ReadFile(s.LogPath); string(log) != "ran\n" {
		t.Errorf("log %q", log)
	}
}

// A supervisor whose agent ended by itself runs the next agent, which
// finds nothing of the last one's: not its environment, directory or
// output, which the idle supervisor no longer holds. One whose agent the
// runner stopped is not taken back: it ends, and the next agent gets
// another.
func TestPoolSupervisorRunsTheNextAgent(t *testing.T) {
	p := agent.NewPool(1, 1, nil)
	defer p.Close()
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		// Ready in the pool, not only started: a run that found none
		// ready would start its own, which the pool, full once the
		// first is ready, would not keep.
		if n, ready := len(supervisorsOf(os.Getpid())), p.Waiting(); n != 1 || ready != 1 {
			return fmt.Errorf("%d supervisors started, %d ready, want 1", n, ready)
		}
		return nil
	})
	dir := t.TempDir()
	argv := script(t, dir, `echo "$PPID ${ORCH_FIRST:-unset} $(pwd)"; exit 3`)
	run := func(env ...string) (pid int, rest string) {
		t.Helper()
		s := spec(t, argv)
		s.Env = append(s.Env, env...)
		res := p.Run(context.Background(), s)
		var exit *agent.ExitError
		if res.ExitCode != 3 || !errors.As(res.Err, &exit) || res.Err.Error() != "agent exited: exit status 3" {
			t.Fatalf("run: %+v, want exit status 3", res)
		}
		log, _ := os.ReadFile(s.LogPath)
		f := strings.Fields(string(log))
		if len(f) != 3 || f[2] != s.Dir {
			t.Fatalf("log %q, want the supervisor's pid, ORCH_FIRST and %s", log, s.Dir)
		}
		pid, _ = strconv.Atoi(f[0])
		return pid, f[1]
	}
	first, env := run("ORCH_FIRST=yes")
	if env != "yes" {
		t.Fatalf("first agent's ORCH_FIRST = %q", env)
	}
	for fd := range 3 {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", first, fd)); l != os.DevNull {
			t.Errorf("idle supervisor's fd %d is %q, want %s", fd, l, os.DevNull)
		}
	}
	if cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", first)); cwd != "/" {
		t.Errorf("idle supervisor's directory is %q, want /", cwd)
	}
	second, env := run()
	if second != first || env != "unset" {
		t.Fatalf("second agent: supervisor %d with ORCH_FIRST %q; want the first's (%d), unset", second, env, first)
	}

	stopped := filepath.Join(t.TempDir(), "stopped")
	s := spec(t, script(t, t.TempDir(), fmt.Sprintf("echo $PPID > %s\nexec sleep 300\n", stopped)))
	cause := errors.New("stopped")
	if res := p.Run(cancelWhenExists(t, stopped, cause, "the agent never started"), s); !errors.Is(res.Err, cause) {
		t.Fatalf("stopped run: %+v", res)
	}
	if sup := testkit.ReadPid(t, stopped); sup != first {
		t.Fatalf("the stopped agent ran under %d, want %d", sup, first)
	}
	testkit.WaitGone(t, agent.Alive, first)
	if third, _ := run(); third == first {
		t.Errorf("the supervisor of a stopped agent ran the next one")
	}
}

// A run that ends after its pool was closed ends its supervisor: none is
// kept where no one would end it.
func TestPoolClosedWhileRunning(t *testing.T) {
	p := agent.NewPool(1, 1, nil)
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	s := spec(t, script(t, dir, fmt.Sprintf("echo $PPID > %s\nwhile [ ! -e %s ]; do sleep 0.01; done\n", started, release)))
	ran := make(chan agent.Result, 1)
	go func() { ran <- p.Run(context.Background(), s) }()
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		_, err := os.Stat(started)
		return err
	})
	p.Close()
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := <-ran; res.Err != nil {
		t.Fatalf("run: %+v", res)
	}
	testkit.WaitGone(t, agent.Alive, testkit.ReadPid(t, started))
	if left := supervisorsOf(os.Getpid()); len(left) > 0 {
		t.Errorf("supervisors %v left after Close", left)
	}
}
