package sandbox

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/testkit"
)

// initPkg is orch's own init program.
const initPkg = "github.com/orch-dev/orch/services/runner/cmd/orch-sandbox-init"

// TestFindInit: the runner takes orch-sandbox-init from beside its
// executable when it answers the probe as this runner expects, passes
// over (saying why) one that answers otherwise, as one built from
// another revision would, and serves as init itself when there is none;
// ORCH_AGENT_SANDBOX_INIT names the program, and one that does not
// answer is an error at start, not a failure in every job.
func TestFindInit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	built := testkit.Build(t, t.TempDir(), initPkg)

	dir := t.TempDir()
	exe := filepath.Join(dir, "runner")
	if got, note, err := FindInit(ctx, "", exe); got != exe || note != "" || err != nil {
		t.Errorf("nothing beside the runner: %q, %q, %v; want the runner itself", got, note, err)
	}
	beside := filepath.Join(dir, InitName)
	if err := os.Link(built, beside); err != nil {
		t.Fatal(err)
	}
	if got, note, err := FindInit(ctx, "", exe); got != beside || note != "" || err != nil {
		t.Errorf("orch-sandbox-init beside the runner: %q, %q, %v; want it taken", got, note, err)
	}

	stale := t.TempDir()
	testkit.Script(t, filepath.Join(stale, InitName), "echo orch-sandbox-ok 0\n")
	exe = filepath.Join(stale, "runner")
	if got, note, err := FindInit(ctx, "", exe); got != exe || !strings.Contains(note, `answered "orch-sandbox-ok 0"`) || err != nil {
		t.Errorf("another revision beside the runner: %q, %q, %v; want the runner itself and why", got, note, err)
	}

	if got, _, err := FindInit(ctx, built, exe); got != built || err != nil {
		t.Errorf("ORCH_AGENT_SANDBOX_INIT=%s: %q, %v", built, got, err)
	}
	broken := testkit.Script(t, filepath.Join(t.TempDir(), "init"), "exit 1\n")
	if _, _, err := FindInit(ctx, broken, exe); err == nil || !strings.Contains(err.Error(), "ORCH_AGENT_SANDBOX_INIT") {
		t.Errorf("ORCH_AGENT_SANDBOX_INIT naming a program that fails: %v, want an error naming the variable", err)
	}
}

// TestOwnInitForwardsAndLimits: orch-sandbox-init, run as a job's init
// under the allowlist network with limits, forwards the sandbox's
// 127.0.0.1:ForwardPort to the unix socket bound in and starts the
// agent through its rlimits step (itself again), limits in place.
func TestOwnInitForwardsAndLimits(t *testing.T) {
	bwrap := requireBwrap(t)
	t.Parallel()
	root := t.TempDir()
	wt := worktree(t, root)
	init := testkit.Build(t, t.TempDir(), initPkg)

	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			_, _ = c.Write([]byte("pong " + line))
			_ = c.Close()
		}
	}()

	j := Job{Bwrap: bwrap, Init: init, Network: NetAllowlist, Socket: sock, Worktree: wt,
		Home: filepath.Join(root, "homes", "p", "task"), PATH: "/usr/bin:/bin",
		Limits: Limits{MemoryMax: 512 << 20, PidsMax: 1000},
		Argv: []string{"bash", "-c", `exec 3<>/dev/tcp/127.0.0.1/` + strconv.Itoa(ForwardPort) + ` && echo ping >&3 && cat <&3
grep -E 'Max (data size|processes)' /proc/self/limits | tr -s ' '; exit 5`}}
	out, code := runJob(t, j, nil)
	if code != 5 {
		t.Errorf("exit %d, want the agent's 5; output:\n%s", code, out)
	}
	for _, want := range []string{"pong ping", "Max data size 536870912 536870912", "Max processes 1000 1000"} {
		if !strings.Contains(out, want) {
			t.Errorf("the agent's output lacks %q:\n%s", want, out)
		}
	}
}
