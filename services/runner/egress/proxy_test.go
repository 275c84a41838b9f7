package egress_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/services/runner/egress"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a proxy under test served on loopback TCP, with what it
// wrote into the job's log and what it counted as denied.
type fixture struct {
	proxy *egress.Proxy
	base  string // http://127.0.0.1:<port>
	mu    sync.Mutex
	lines []string
	deny  atomic.Int64
}

// setup serves a proxy with o (JobLog, OnDenied and Logger are the
// fixture's) and closes it when the test ends.
func setup(t *testing.T, o egress.Options) *fixture {
	t.Helper()
	f := &fixture{}
	o.JobLog = func(l string) {
		f.mu.Lock()
		f.lines = append(f.lines, l)
		f.mu.Unlock()
	}
	o.OnDenied = func(string) { f.deny.Add(1) }
	o.Logger = zaptest.NewLogger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := egress.Serve(ln, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	f.proxy, f.base = p, "http://"+ln.Addr().String()
	return f
}

func (f *fixture) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.lines)
}

// hasLine fails the test unless the job log holds line.
func (f *fixture) hasLine(t *testing.T, line string) {
	t.Helper()
	if !slices.Contains(f.log(), line) {
		t.Fatalf("job log lacks %q; it holds %q", line, f.log())
	}
}

// client is an HTTP client using the proxy, trusting tlsServer's
// certificate when it is set.
func (f *fixture) client(t *testing.T, tlsServer *httptest.Server) *http.Client {
	t.Helper()
	pu, _ := url.Parse(f.base)
	tr := &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true}
	if tlsServer != nil {
		tr.TLSClientConfig = tlsServer.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// target is a host the agent wants to reach: it counts its requests.
type target struct {
	*httptest.Server
	hits atomic.Int64
}

func newTarget(t *testing.T, tls bool) *target {
	tg := &target{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.hits.Add(1)
		fmt.Fprintf(w, "hello from %s %s", r.Host, r.URL.Path)
	})
	if tls {
		tg.Server = httptest.NewTLSServer(h)
	} else {
		tg.Server = httptest.NewServer(h)
	}
	t.Cleanup(tg.Close)
	return tg
}

func (tg *target) hostport() string { return tg.Listener.Addr().String() }

func get(t *testing.T, c *http.Client, u string) (int, string, error) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestTunnelReachesAllowedHost(t *testing.T) {
	tg := newTarget(t, true)
	f := setup(t, egress.Options{Allow: []string{tg.hostport()}, LogAllowed: true})
	code, body, err := get(t, f.client(t, tg.Server), tg.URL+"/x")
	if err != nil || code != 200 || !strings.HasPrefix(body, "hello from") {
		t.Fatalf("GET through the tunnel: %d %q %v", code, body, err)
	}
	f.hasLine(t, "orch: egress "+tg.hostport())
	if f.deny.Load() != 0 {
		t.Fatalf("denied %d", f.deny.Load())
	}
}

func TestTunnelToHostNotAllowedIsRefused(t *testing.T) {
	allowed, other := newTarget(t, true), newTarget(t, true)
	f := setup(t, egress.Options{Allow: []string{allowed.hostport()}})
	if _, _, err := get(t, f.client(t, other.Server), other.URL+"/"); err == nil {
		t.Fatal("GET through the tunnel to a host not allowed succeeded")
	}
	f.hasLine(t, "orch: egress denied "+other.hostport())
	if other.hits.Load() != 0 || f.deny.Load() != 1 {
		t.Fatalf("target hits %d, denied %d; want 0, 1", other.hits.Load(), f.deny.Load())
	}
	// The refusal itself says why, to a client that reads it.
	status, body := connect(t, f.base, other.hostport())
	if !strings.Contains(status, "403") || !strings.Contains(body, "not in the allowlist") {
		t.Fatalf("CONNECT answer %q %q", status, body)
	}
}

// connect sends a raw CONNECT for target and returns the status line and
// the body of the answer.
func connect(t *testing.T, proxyBase, target string) (string, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(proxyBase, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

func TestPlainHTTPForwardedOnlyToAllowedHost(t *testing.T) {
	allowed, other := newTarget(t, false), newTarget(t, false)
	f := setup(t, egress.Options{Allow: []string{allowed.hostport()}})
	c := f.client(t, nil)
	code, body, err := get(t, c, allowed.URL+"/a?b=c")
	if err != nil || code != 200 || body != "hello from "+allowed.hostport()+" /a" {
		t.Fatalf("GET allowed: %d %q %v", code, body, err)
	}
	// A Host header naming another site does not reach it: the request
	// goes out to, and with the Host of, the URL's host.
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s/h HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", allowed.URL, other.hostport())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello from "+allowed.hostport()+" /h" {
		t.Fatalf("GET with another Host: %q", b)
	}
	code, body, err = get(t, c, other.URL+"/")
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, "not in the allowlist") {
		t.Fatalf("GET not allowed: %d %q %v", code, body, err)
	}
	f.hasLine(t, "orch: egress denied "+other.hostport())
	if other.hits.Load() != 0 {
		t.Fatal("the host not allowed was reached")
	}
}

// TestTricksDoNotPassTheAllowlist sends targets that name an allowed host
// but lead elsewhere, or name the host's own addresses another way.
func TestTricksDoNotPassTheAllowlist(t *testing.T) {
	tg := newTarget(t, false)
	_, port, _ := net.SplitHostPort(tg.hostport())
	f := setup(t, egress.Options{Allow: []string{
		"allowed.example.com:" + port,
		"localhost:" + port, // a name, resolving to loopback: not enough
	}})
	for _, c := range []struct{ name, connect, get, denied string }{
		// net/http itself answers 400 to a Host header with userinfo,
		// before the proxy sees the request: nothing to log.
		{name: "userinfo in CONNECT", connect: "allowed.example.com@127.0.0.1:" + port},
		{name: "userinfo in URL", get: "http://allowed.example.com:" + port + "@127.0.0.1:" + port + "/", denied: "127.0.0.1:" + port},
		{name: "loopback literal", connect: "127.0.0.1:" + port, denied: "127.0.0.1:" + port},
		{name: "short loopback", connect: "127.1:" + port, denied: "127.1:" + port},
		{name: "IPv6 loopback", connect: "[::1]:" + port, denied: "[::1]:" + port},
		{name: "name resolving to loopback", connect: "localhost:" + port, denied: "localhost:" + port},
		{name: "name resolving to loopback, plain", get: "http://LOCALHOST:" + port + "/", denied: "localhost:" + port},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.connect != "" {
				status, body := connect(t, f.base, c.connect)
				if !strings.HasPrefix(status, "403") && !strings.HasPrefix(status, "400") {
					t.Fatalf("CONNECT %s: %s %s", c.connect, status, body)
				}
			} else {
				code, body, err := get(t, f.client(t, nil), c.get)
				if err != nil || code != http.StatusForbidden {
					t.Fatalf("GET %s: %d %q %v", c.get, code, body, err)
				}
			}
			if c.denied != "" {
				f.hasLine(t, "orch: egress denied "+c.denied)
			}
		})
	}
	if tg.hits.Load() != 0 {
		t.Fatalf("the loopback target was reached %d times", tg.hits.Load())
	}
}

func TestOtherPathsAreRefused(t *testing.T) {
	f := setup(t, egress.Options{})
	code, body, err := get(t, http.DefaultClient, f.base+"/etc/passwd")
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, "serves CONNECT, absolute http:// URLs, /model/ and /git/ only") {
		t.Fatalf("GET /etc/passwd: %d %q %v", code, body, err)
	}
	f.hasLine(t, "orch: egress denied path /etc/passwd")
}

func TestBadOptionsAreRefused(t *testing.T) {
	for _, o := range []egress.Options{
		{Allow: []string{"example.com:http"}},
		{Allow: []string{"user@example.com"}},
		{Allow: []string{"example.com/path"}},
		{GitHosts: []string{"git@example.com:org/repo.git"}},
		{GitHosts: []string{"https://example.com/org/../repo.git"}},
		{ModelUpstream: "api.anthropic.com"},
		{GitCredentials: "/nonexistent/credentials"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if p, err := egress.Serve(ln, o); err == nil {
			p.Close()
			t.Errorf("Serve(%+v) took the options", o)
		}
	}
}

// echo is a TCP listener that echoes what it reads, for tunnels.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { io.Copy(c, c); c.Close() })
		}
	})
	return ln.Addr().String()
}

// openTunnel CONNECTs to target and returns the tunnel's connection.
func openTunnel(t *testing.T, proxyBase, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(proxyBase, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("CONNECT %s: %s %s", target, resp.Status, b)
	}
	return c, br
}

func TestTunnelsAreBoundedPerJob(t *testing.T) {
	e := echo(t)
	f := setup(t, egress.Options{Allow: []string{e}, MaxTunnels: 2})
	openTunnel(t, f.base, e)
	openTunnel(t, f.base, e)
	status, body := connect(t, f.base, e)
	if !strings.HasPrefix(status, "503") || !strings.Contains(body, "2 tunnels open already") {
		t.Fatalf("third tunnel: %s %s", status, body)
	}
	f.hasLine(t, "orch: egress busy "+e+": 2 tunnels open already")
}

func TestTunnelCopiesEachWriteAtOnce(t *testing.T) {
	e := echo(t)
	f := setup(t, egress.Options{Allow: []string{e}})
	c, br := openTunnel(t, f.base, e)
	// Each round trip waits for its own echo: a proxy that buffered
	// until more bytes came would hang here.
	for i := range 50 {
		msg := fmt.Sprintf("ping %d\n", i)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo %d: %q %v", i, got, err)
		}
	}
}

func TestIdleTunnelIsClosed(t *testing.T) {
	e := echo(t)
	f := setup(t, egress.Options{Allow: []string{e}, IdleTimeout: 100 * time.Millisecond})
	c, br := openTunnel(t, f.base, e)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("read on an idle tunnel: %v, want EOF once the proxy closes it", err)
	}
}

// TestCloseEndsEverything closes the proxy while a tunnel is open and a
// streamed model answer is half read: both end, and (TestMain's goleak)
// nothing is left running.
func TestCloseEndsEverything(t *testing.T) {
	e := echo(t)
	up := newStreamingUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := egress.Serve(ln, egress.Options{Allow: []string{e}, ModelUpstream: up.URL, APIKey: "real"})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	c, br := openTunnel(t, base, e)
	resp := postMessages(t, base+"/model", true)
	defer resp.Body.Close()
	readEvent(t, bufio.NewReader(resp.Body)) // message_start
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return with a tunnel and a stream open")
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the tunnel is still open after Close")
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the stream ended cleanly after Close, want it cut")
	}
	close(up.release)
}

func TestListenServesOnAUnixSocket(t *testing.T) {
	tg := newTarget(t, false)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := egress.Listen(sock, egress.Options{}); err == nil {
		t.Fatal("Listen replaced a file that is not a socket")
	}
	os.Remove(sock)
	p, err := egress.Listen(sock, egress.Options{Allow: []string{tg.hostport()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	tr := &http.Transport{
		Proxy:       http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
		DialContext: func(_ context.Context, _, _ string) (net.Conn, error) { return net.Dial("unix", sock) },
	}
	defer tr.CloseIdleConnections()
	code, body, err := get(t, &http.Client{Transport: tr}, tg.URL+"/")
	if err != nil || code != 200 {
		t.Fatalf("GET over the socket: %d %q %v", code, body, err)
	}
	p.Close()
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, err := os.Stat(sock); err == nil {
			return fmt.Errorf("socket %s still there after Close", sock)
		}
		return nil
	})
}

// A proxy made with New says what the agent is to be told before it
// serves (the runner starts the sandbox in between), serves once Listen
// is called, and a closed one, or one serving already, does not serve
// again; Close of one that never served returns.
func TestNewServesOnceListening(t *testing.T) {
	tg := newTarget(t, false)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	idle, err := egress.New(egress.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(); err != nil {
		t.Fatalf("Close of a proxy that never served: %v", err)
	}
	if err := idle.Listen(sock); err == nil {
		t.Fatal("a closed proxy listened")
	}
	if _, err := egress.New(egress.Options{Allow: []string{"bad host:port:x"}}); err == nil {
		t.Fatal("New took a bad allowlist")
	}
	os.Remove(sock)
	p, err := egress.New(egress.Options{Allow: []string{tg.hostport()}, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if env := strings.Join(p.AgentEnv("http://127.0.0.1:3128"), " "); !strings.Contains(env, "HTTPS_PROXY=http://127.0.0.1:3128") {
		t.Errorf("AgentEnv before Listen: %s", env)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Fatal("a socket before Listen")
	}
	if err := p.Listen(sock); err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(sock + "2"); err == nil {
		t.Error("a proxy listened twice")
	}
	tr := &http.Transport{
		Proxy:       http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
		DialContext: func(_ context.Context, _, _ string) (net.Conn, error) { return net.Dial("unix", sock) },
	}
	defer tr.CloseIdleConnections()
	if code, body, err := get(t, &http.Client{Transport: tr}, tg.URL+"/"); err != nil || code != 200 {
		t.Fatalf("GET over the socket: %d %q %v", code, body, err)
	}
}
