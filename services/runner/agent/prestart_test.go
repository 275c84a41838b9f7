package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/agent"
)

// prestartOwnerEnv makes the test binary a process that starts an agent
// up to its gate and waits to be killed (prestartOwner); its value is the
// directory of the agent's files.
const prestartOwnerEnv = "ORCH_TEST_PRESTART_OWNER"

// gated is a gated spec in dir, as bwrap's --block-fd runs it: the
// command writes its pid to dir/gated.pid, waits at the gate (descriptor
// agent.GateFD) until it reads a byte or the gate's end of file, and then
// runs the agent, either way. The agent writes dir/ran, then runs body.
func gated(t testing.TB, dir, body string) agent.Spec {
	t.Helper()
	s, err := gatedSpec(dir, body)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gatedSpec(dir, body string) (agent.Spec, error) {
	agentSh := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(agentSh, []byte("touch "+filepath.Join(dir, "ran")+"\n"+body+"\n"), 0o644); err != nil {
		return agent.Spec{}, err
	}
	gate := fmt.Sprintf(`echo $$ > %s; head -c 1 <&%d >/dev/null; exec %d<&-; exec sh %s`,
		filepath.Join(dir, "gated.pid"), agent.GateFD, agent.GateFD, agentSh)
	return agent.Spec{Argv: []string{"sh", "-c", gate}, Dir: dir, Env: agent.Env(agent.EnvAllowDefault), Gated: true,
		LogPath: filepath.Join(dir, "logs", "1.log"), KillGrace: 200 * time.Millisecond, Drained: func() {}}, nil
}

// atGate waits until the gated command in dir waits at its gate, and
// returns its pid.
func atGate(t *testing.T, dir string) int {
	t.Helper()
	var pid int
	natstest.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		b, err := os.ReadFile(filepath.Join(dir, "gated.pid"))
		if err != nil {
			return err
		}
		if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return err
		}
		return nil
	})
	return pid
}

func ran(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "ran"))
	return err == nil
}

// An agent started up to its gate runs nothing of its own until Run
// opens the gate; then it runs as any other, with Run's task text on its
// input, the files Prestart was given, and its output in the log.
func TestPrestartRunsOnceOpened(t *testing.T) {
	p := agent.NewPool(1, 1, nil)
	defer p.Close()
	dir := t.TempDir()
	// A file given with it is the command's next descriptor after the
	// gate, though the caller closes its own once Prestart returns.
	s := gated(t, dir, fmt.Sprintf(`read line; echo "got $line"; cat <&%d`, agent.GateFD+1))
	if err := os.WriteFile(filepath.Join(dir, "given"), []byte("and the file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	given, err := os.Open(filepath.Join(dir, "given"))
	if err != nil {
		t.Fatal(err)
	}
	s.Files = []*os.File{given}
	st, err := p.Prestart(s)
	_ = given.Close()
	if err != nil {
		t.Fatal(err)
	}
	atGate(t, dir)
	if ran(dir) {
		t.Fatal("the agent ran before its gate opened")
	}
	s.Started, s.Stdin = st, "the task\n"
	res := p.Run(context.Background(), s)
	if res.Err != nil {
		t.Fatalf("run: %+v", res)
	}
	if !ran(dir) {
		t.Error("the agent did not run once its gate opened")
	}
	if log, _ := os.ReadFile(s.LogPath); string(log) != "got the task\nand the file\n" {
		t.Errorf("log %q", log)
	}
}

// An agent started up to its gate and aborted never runs: its sandbox is
// killed and reaped when Abort returns. So is one whose spec Run is not
// given the same: Run starts its own agent instead.
func TestPrestartAborted(t *testing.T) {
	p := agent.NewPool(1, 1, nil)
	defer p.Close()
	t.Run("abort", func(t *testing.T) {
		dir := t.TempDir()
		st, err := p.Prestart(gated(t, dir, "exit 0"))
		if err != nil {
			t.Fatal(err)
		}
		pid := atGate(t, dir)
		st.Abort()
		if agent.Alive(pid) {
			t.Errorf("the gated command %d lives on after Abort", pid)
		}
		if ran(dir) {
			t.Error("an aborted agent ran")
		}
	})
	t.Run("another spec", func(t *testing.T) {
		dir, other := t.TempDir(), t.TempDir()
		st, err := p.Prestart(gated(t, dir, "exit 0"))
		if err != nil {
			t.Fatal(err)
		}
		pid := atGate(t, dir)
		s := gated(t, other, "echo other")
		s.Started = st
		if res := p.Run(context.Background(), s); res.Err != nil {
			t.Fatalf("run: %+v", res)
		}
		if agent.Alive(pid) {
			t.Errorf("the started command %d lives on after a run of another spec", pid)
		}
		if ran(dir) || !ran(other) {
			t.Errorf("ran: the started spec %t (want false), the run's %t (want true)", ran(dir), ran(other))
		}
	})
}

// An agent waiting at its gate never runs when its runner dies, even by
// SIGKILL: the gate's end of file does not open it, and the supervisor
// kills the sandbox.
func TestPrestartRunnerKilled(t *testing.T) {
	dir := t.TempDir()
	cmd := startOwner(t, prestartOwnerEnv+"="+dir)
	pid := atGate(t, dir)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	testkit.WaitGone(t, agent.Alive, pid)
	if ran(dir) {
		t.Error("the agent ran after its runner died at the gate")
	}
}

// The end of file on the control socket alone (the runner's end closed,
// no signal sent) is the runner's death to a supervisor whose agent
// waits at its gate: it kills the sandbox, and nothing of the agent runs.
func TestPrestartControlClosed(t *testing.T) {
	p := agent.NewPool(1, 1, nil)
	defer p.Close()
	dir := t.TempDir()
	st, err := p.Prestart(gated(t, dir, "exit 0"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort()
	pid := atGate(t, dir)
	st.CloseControl()
	testkit.WaitGone(t, agent.Alive, pid)
	if ran(dir) {
		t.Error("the agent ran once its runner's end of the control socket closed")
	}
}

// prestartOwner starts an agent up to its gate in the directory its
// environment names, says so on stdout and waits for its end.
func prestartOwner() {
	p := agent.NewPool(1, 1, nil)
	s, err := gatedSpec(os.Getenv(prestartOwnerEnv), "exit 0")
	if err == nil {
		_, err = p.Prestart(s)
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}
