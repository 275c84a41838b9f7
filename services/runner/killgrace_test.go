package runner_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
)

// ORCH_AGENT_KILL_GRACE=0 is one value for the agent and the task lock:
// a runner cut off from NATS stops its agent at once, so a runner that
// takes the lock over (its revision ORCH_ACK_WAIT + 0 old) never runs the
// task beside it. When the agent turned 0 into 5 s of its own, an agent
// that ignores SIGTERM still ran when the next attempt began.
func TestZeroKillGraceIsTheLocksToo(t *testing.T) {
	e := newEnv(t, "")
	p := newProxy(t, e.srv.URL())
	agentCmd := e.script(`if test "$ORCH_ATTEMPT" = 1; then
  trap '' TERM
  sleep 300 & echo $! > $RUNS/child.pid
  echo $$ > $RUNS/agent.1.pid
  wait
  exit 0
fi
for p in $(cat $RUNS/agent.1.pid $RUNS/child.pid); do
  if test -r /proc/$p/stat && ! sed 's/^.*) //' /proc/$p/stat | grep -q '^[ZX]'; then
    echo $p >> $RUNS/alive-at-restart
  fi
done
`)
	// Unconfined: the later agent looks for the first one's processes in
	// /proc, which a sandbox's own pid namespace would hide.
	vars := []string{"ORCH_ACK_WAIT=3s", "ORCH_AGENT_KILL_GRACE=0", "ORCH_AGENT_SANDBOX=none"}
	e.startProcess("cut-off", agentCmd, append(vars, "ORCH_NATS_URL="+p.url)...)
	j := job("kill-grace-zero", "task-grace", proto.KindImplement)
	e.enqueue(j)
	first, child := e.pid("agent.1.pid"), e.pid("child.pid")
	e.waitState(j.ID, proto.StateRunning, 30*time.Second)
	e.startProcess("other", agentCmd, vars...)

	p.cut()
	st := e.waitState(j.ID, proto.StateDone, 60*time.Second)
	if st.Runner != "other" || st.Attempt < 2 {
		t.Errorf("status %+v, want done by the other runner", st)
	}
	testkit.WaitGone(t, agent.Alive, first, child)
	if alive := e.lines("alive-at-restart"); len(alive) > 0 {
		t.Errorf("processes %v of the cut-off runner's agent (%d, %d) were alive when the other runner's began", alive, first, child)
	}
}

// proxy forwards TCP connections to a NATS server until it is cut: then
// it closes them and every new one, as a partition would for the clients
// behind it.
type proxy struct {
	url    string
	target string
	ln     net.Listener
	mu     sync.Mutex
	isCut  bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, natsURL string) *proxy {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{url: "nats://" + ln.Addr().String(), target: u.Host, ln: ln}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.isCut {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			continue
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		p.wg.Go(func() { pipe(s, c) })
		p.wg.Go(func() { pipe(c, s) })
	}
}

// cut closes every connection and refuses new ones from now on.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
