package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// A forwarding pool's supervisor lives in a network namespace of its own,
// where its port leads to the socket of the agent it runs, and to
// nothing between agents; the runner's loopback is out of reach; and a
// stopped agent gets its SIGTERM and grace through the wrapper.
func TestPoolForwards(t *testing.T) {
	bwrap := testkit.RequireBwrap(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	dir := t.TempDir()
	// The job's egress proxy, as a unix socket: it greets and hangs up.
	sock := filepath.Join(dir, "egress.sock")
	proxy, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	go func() {
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello from the proxy\n"))
			_ = c.Close()
		}
	}()
	// A service on the runner's own loopback.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close() })
	hostPort := host.Addr().(*net.TCPAddr).Port

	p := agent.NewPool(1, 1, &agent.Forwarding{Wrap: sandbox.NetnsCommand(bwrap), Port: 3128})
	defer p.Close()
	argv := []string{"bash", testkit.Script(t, filepath.Join(dir, "agent.sh"), fmt.Sprintf(`
readlink /proc/self/ns/net
if { exec 3<>/dev/tcp/127.0.0.1/3128; } 2>/dev/null; then echo "port: $(cat <&3)"; else echo "port: refused"; fi
if { exec 4<>/dev/tcp/127.0.0.1/%d; } 2>/dev/null; then echo "host: reached"; else echo "host: unreachable"; fi
echo $PPID
`, hostPort))}
	run := func(forward string) []string {
		t.Helper()
		s := spec(t, argv)
		s.Forward = forward
		if res := p.Run(context.Background(), s); res.Err != nil {
			t.Fatalf("run: %+v", res)
		}
		log, _ := os.ReadFile(s.LogPath)
		lines := strings.Split(strings.TrimSpace(string(log)), "\n")
		if len(lines) != 4 {
			t.Fatalf("log %q: want the namespace, the port, the host and the supervisor", log)
		}
		return lines
	}
	ours, _ := os.Readlink("/proc/self/ns/net")
	run(sock) // the pool's supervisor, or one started for the run, is kept for the next
	first := run(sock)
	if first[0] == ours {
		t.Errorf("the agent shares the runner's network namespace %s", ours)
	}
	if first[1] != "port: hello from the proxy" {
		t.Errorf("through the port: %q, want the proxy's greeting", first[1])
	}
	if first[2] != "host: unreachable" {
		t.Errorf("the runner's loopback: %q", first[2])
	}
	second := run("")
	if second[3] != first[3] {
		t.Fatalf("second agent ran under supervisor %s, want the first's, %s", second[3], first[3])
	}
	if second[1] != "port: " {
		t.Errorf("an agent with nothing to forward to got %q through the port, want a closed connection", second[1])
	}

	// Stopped: the SIGTERM reaches the agent (its trap writes), and
	// its exit ends the run within the grace.
	stopped, termed := filepath.Join(dir, "stopped"), filepath.Join(dir, "termed")
	s := spec(t, []string{"bash", testkit.Script(t, filepath.Join(dir, "stop.sh"), fmt.Sprintf(`
trap 'echo term > %s; exit 0' TERM
echo $PPID > %s
while :; do sleep 0.05; done
`, termed, stopped))})
	s.Forward, s.KillGrace = sock, 10*time.Second
	cause := errors.New("stopped")
	if res := p.Run(cancelWhenExists(t, stopped, cause, "the agent never started"), s); !errors.Is(res.Err, cause) {
		t.Fatalf("stopped run: %+v", res)
	}
	if b, err := os.ReadFile(termed); err != nil || strings.TrimSpace(string(b)) != "term" {
		t.Errorf("the stopped agent's trap: %q, %v; want its SIGTERM", b, err)
	}
	sup := testkit.ReadPid(t, stopped)
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if agent.Alive(sup) {
			return fmt.Errorf("supervisor %d of a stopped agent still runs", sup)
		}
		return nil
	})
}

// An agent with a socket to forward to needs a forwarding pool.
func TestForwardNeedsForwardingPool(t *testing.T) {
	s := spec(t, []string{"true"})
	s.Forward = filepath.Join(t.TempDir(), "egress.sock")
	if res := agent.Run(context.Background(), s); res.Err == nil || !strings.Contains(res.Err.Error(), "network namespaces") {
		t.Errorf("got %+v, want an error naming the pool's network namespaces", res)
	}
}
