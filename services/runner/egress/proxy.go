// Package egress is the proxy a confined agent's only way out goes
// through: one per job, on a unix socket the sandbox reaches through a
// forwarder (or on a TCP listener when the agent's network is open).
//
// One listener serves three roles, told apart by the request line:
//
//   - CONNECT host:port opens a tunnel, and an absolute-URI request
//     (GET http://host/...) is forwarded as a plain HTTP proxy would,
//     both only to a host:port the allowlist names (tunnel.go, forward.go,
//     allow.go);
//   - /model/... is a reverse proxy to the model API that puts the
//     runner's real credential on each request in place of the agent's
//     placeholder and meters tokens and cost from the answers as they
//     stream through (model.go, meter.go, prices.go);
//   - /git/<scheme>/<host>/... is a reverse proxy to a git host that adds
//     the runner's credential for that host (git.go).
//
// What must hold: the agent never holds a real credential (it gets
// placeholders from AgentEnv, and whatever credential it sends is dropped
// before a request leaves); nothing leaves for a host:port the allowlist
// does not name, whichever form the request takes; every refusal is
// written into the job's own log as "orch: egress denied <host:port>";
// Close leaves no goroutine and no open connection behind.
package egress

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Defaults of Options.
const (
	// ModelUpstreamDefault is where model requests go when
	// Options.ModelUpstream is empty: Anthropic's API.
	ModelUpstreamDefault = "https://api.anthropic.com"
	// MaxTunnelsDefault bounds the tunnels one job holds open at once: a
	// package manager opens a few dozen, an agent that opens thousands is
	// scanning.
	MaxTunnelsDefault = 64
	// IdleTimeoutDefault closes a tunnel, or a client connection between
	// requests, after this long without a byte either way.
	IdleTimeoutDefault = 5 * time.Minute
	// DialTimeoutDefault bounds connecting to an allowed host.
	DialTimeoutDefault = 10 * time.Second
)

// Placeholders the agent gets in place of the runner's credentials. They
// are not secrets: the proxy drops whatever credential the agent sends.
const (
	PlaceholderAPIKey     = "orch-placeholder-key"
	PlaceholderOAuthToken = "orch-placeholder-oauth-token"
)

// Options configure one job's proxy.
type Options struct {
	// Project is the job's project key, on every log line.
	Project string
	// Allow is what tunnels and plain HTTP may reach: host[:port] entries,
	// port 443 when an entry has none (ORCH_AGENT_EGRESS, the registry's
	// egress list, the project's git host, the model API host). A host
	// matches case-insensitively, a port exactly; an IP literal matches
	// only itself.
	Allow []string
	// GitHosts are what the /git/ reverse proxy serves, http or https: a
	// repository's clone URL (the project's clone_url) for that repository
	// alone, so the runner's credential reaches no other repository of
	// the host, or scheme://host[:port] for the whole host. AgentEnv
	// rewrites git URLs of each host.
	GitHosts []string
	// ModelUpstream is where /model/ requests go, the runner's own
	// ANTHROPIC_BASE_URL; ModelUpstreamDefault when empty.
	ModelUpstream string
	// APIKey and OAuthToken are the runner's real model credentials; either
	// may be empty. APIKey is sent as x-api-key when set, else OAuthToken
	// as Authorization: Bearer.
	APIKey, OAuthToken string
	// GitCredentials is the path of a git-credential-store file
	// (https://user:token@host lines) whose entry for a git host the /git/
	// proxy adds as Basic auth; empty for none.
	GitCredentials string
	// Prices price the metered tokens by model; DefaultPrices when nil.
	Prices map[string]Price
	// MaxTunnels bounds the tunnels open at once; MaxTunnelsDefault when 0.
	MaxTunnels int
	// IdleTimeout closes idle tunnels and client connections;
	// IdleTimeoutDefault when 0.
	IdleTimeout time.Duration
	// DialTimeout bounds connecting to an allowed host; DialTimeoutDefault
	// when 0.
	DialTimeout time.Duration
	// LogAllowed writes "orch: egress <host:port>" into JobLog for every
	// allowed connection too, not only to Logger at debug level: the
	// runner sets it when its log level is debug.
	LogAllowed bool
	// JobLog writes one line into the job's own log; nil drops them.
	JobLog func(line string)
	// OnDenied is called once per refused connection with its target, for
	// the runner's per-project counter (orch_runner_egress_denied_total);
	// nil for none.
	OnDenied func(target string)
	// Logger is the runner's logger for this job; zap.NewNop when nil.
	Logger *zap.Logger
}

// Proxy is one job's egress proxy. Its methods are safe for concurrent use.
type Proxy struct {
	o      Options
	log    *zap.Logger
	allow  allowlist
	model  *url.URL
	git    map[string]*gitHost
	meter  meter
	prices map[string]Price

	// direct dials allowed hosts for plain HTTP; upstream reaches the model
	// API and git hosts, through the runner's own HTTP proxy if it has one.
	direct   *http.Transport
	upstream *http.Transport
	srv      *http.Server
	served   chan struct{}
	// self is the host:port the agent reaches the proxy at, the last base
	// AgentEnv was given.
	self atomic.Pointer[string]
	// errLog takes net/http's own complaints (a client gone mid-answer),
	// at debug level: they are the agent's business, not the operator's.
	errLog *log.Logger
	// tunnelSlots holds one token per open tunnel.
	tunnelSlots chan struct{}

	// mu guards closed and hijacked: a handler starts, and a tunnel
	// registers its connections, only while the proxy is open, so Close
	// sees every one of them.
	mu       sync.Mutex
	closed   bool
	hijacked map[net.Conn]struct{}
	// handlers counts running handlers (a tunnel's copying included);
	// conns counts the server's client connections.
	handlers sync.WaitGroup
	conns    sync.WaitGroup
}

// Listen serves the proxy on a unix socket at socketPath (a stale socket
// left there is replaced; the socket is removed on Close) until Close.
func Listen(socketPath string, o Options) (*Proxy, error) {
	p, err := New(o)
	if err != nil {
		return nil, err
	}
	if err := p.Listen(socketPath); err != nil {
		return nil, err
	}
	return p, nil
}

// Serve serves the proxy on ln, which it owns from then on, until Close:
// for tests, and for an agent whose network is open (a loopback TCP
// listener the agent reaches directly). It checks o first and returns an
// error naming the first bad entry, having closed ln.
func Serve(ln net.Listener, o Options) (*Proxy, error) {
	p, err := New(o)
	if err != nil {
		ln.Close()
		return nil, err
	}
	p.serve(ln)
	return p, nil
}

// New checks o, as Listen does, and makes a proxy that serves nothing
// until its Listen: what the agent is to be told of it (AgentEnv) is
// known before the socket is there, so a sandbox can be started first.
func New(o Options) (*Proxy, error) {
	p, err := newProxy(o)
	if err != nil {
		return nil, err
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       p.o.IdleTimeout,
		ErrorLog:          p.errLog,
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				p.conns.Add(1)
			case http.StateHijacked, http.StateClosed:
				p.conns.Done()
			}
		},
	}
	return p, nil
}

// Listen serves p on a unix socket at socketPath, as the package's
// Listen does. A proxy serves once, and not after Close.
func (p *Proxy) Listen(socketPath string) error {
	if fi, err := os.Lstat(socketPath); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("egress: %s exists and is not a socket", socketPath)
		}
		if err := os.Remove(socketPath); err != nil {
			return fmt.Errorf("egress: removing stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	if err := os.Chmod(socketPath, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("egress: %w", err)
	}
	if !p.serve(ln) {
		ln.Close()
		return errors.New("egress: the proxy is closed, or serves already")
	}
	return nil
}

// serve serves p on ln until Close; false, serving nothing, when p is
// closed or serves already.
func (p *Proxy) serve(ln net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.served != nil {
		return false
	}
	p.served = make(chan struct{})
	go func() {
		defer close(p.served)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("egress proxy stopped serving", zap.Error(err))
		}
	}()
	return true
}

// newProxy checks o, fills in its defaults and builds the proxy's parts.
func newProxy(o Options) (*Proxy, error) {
	o.Logger = cmp.Or(o.Logger, zap.NewNop())
	o.MaxTunnels = cmp.Or(o.MaxTunnels, MaxTunnelsDefault)
	o.IdleTimeout = cmp.Or(o.IdleTimeout, IdleTimeoutDefault)
	o.DialTimeout = cmp.Or(o.DialTimeout, DialTimeoutDefault)
	o.ModelUpstream = cmp.Or(o.ModelUpstream, ModelUpstreamDefault)
	if o.Prices == nil {
		o.Prices = DefaultPrices
	}
	if o.MaxTunnels < 0 || o.IdleTimeout < 0 || o.DialTimeout < 0 {
		return nil, errors.New("egress: MaxTunnels, IdleTimeout and DialTimeout must not be negative")
	}
	p := &Proxy{
		o:           o,
		log:         o.Logger.Named("egress").With(zap.String("project", o.Project)),
		prices:      o.Prices,
		tunnelSlots: make(chan struct{}, o.MaxTunnels),
		hijacked:    map[net.Conn]struct{}{},
	}
	p.errLog, _ = zap.NewStdLogAt(p.log, zapcore.DebugLevel)
	var err error
	if p.allow, err = parseAllowlist(o.Allow); err != nil {
		return nil, err
	}
	if p.model, err = parseUpstream(o.ModelUpstream); err != nil {
		return nil, fmt.Errorf("egress: model upstream: %w", err)
	}
	creds, err := readCredentials(o.GitCredentials)
	if err != nil {
		return nil, err
	}
	if p.git, err = parseGitHosts(o.GitHosts, creds); err != nil {
		return nil, err
	}
	p.direct = &http.Transport{
		Proxy:                 nil,
		DialContext:           p.dialAllowed,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0,
		DisableCompression:    true,
	}
	p.upstream = &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	return p, nil
}

// parseUpstream checks an upstream base URL: http or https, a host, no
// query.
func parseUpstream(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("%q is not an http(s)://host[/path] URL", raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// ServeHTTP counts the request in for Close and hands it to its role.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.begin() {
		http.Error(w, "orch egress proxy: shutting down", http.StatusServiceUnavailable)
		return
	}
	defer p.handlers.Done()
	if r.Method != http.MethodConnect {
		// The reverse proxies may still read the request body (to its
		// end) after the answer's header went out; without full duplex
		// net/http closes the body then, and the upstream request fails.
		http.NewResponseController(w).EnableFullDuplex()
	}
	p.route(w, r)
}

// route hands a request to its role.
func (p *Proxy) route(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		p.tunnel(w, r)
	case r.URL.IsAbs() && p.isSelf(r.URL):
		// A client that ignored NO_PROXY sends its /model/ or /git/
		// request for the proxy through the proxy: serve it as if sent
		// straight.
		r.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
		p.route(w, r)
	case r.URL.IsAbs():
		p.forward(w, r)
	case strings.HasPrefix(r.URL.Path, "/model/"):
		p.modelAPI(w, r)
	case strings.HasPrefix(r.URL.Path, "/git/"):
		p.gitProxy(w, r)
	default:
		p.refuse(w, http.StatusForbidden, "path "+quoteTarget(r.URL.Path),
			"this proxy serves CONNECT, absolute http:// URLs, /model/ and /git/ only")
	}
}

// isSelf says whether an absolute URL names the proxy itself, by the
// address AgentEnv gave the agent, under /model/ or /git/.
func (p *Proxy) isSelf(u *url.URL) bool {
	self := p.self.Load()
	return self != nil && u.Scheme == "http" && strings.EqualFold(u.Host, *self) &&
		(strings.HasPrefix(u.Path, "/model/") || strings.HasPrefix(u.Path, "/git/"))
}

// begin counts a handler in unless the proxy is closed.
func (p *Proxy) begin() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.handlers.Add(1)
	return true
}

// Close stops serving, closes every tunnel and client connection, and
// returns once every goroutine the proxy started has ended.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for c := range p.hijacked {
		c.Close()
	}
	served := p.served
	p.mu.Unlock()
	err := p.srv.Close()
	if served != nil {
		<-served
	}
	p.handlers.Wait()
	p.conns.Wait()
	p.direct.CloseIdleConnections()
	p.upstream.CloseIdleConnections()
	return err
}

// track registers a hijacked connection for Close; false when the proxy
// is closing, and then c is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.hijacked[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.hijacked, c)
	p.mu.Unlock()
	c.Close()
}

// jobLog writes a line into the job's log.
func (p *Proxy) jobLog(line string) {
	if p.o.JobLog != nil {
		p.o.JobLog(line)
	}
}

// allowed notes a connection let through: at debug level, and in the
// job's log when LogAllowed.
func (p *Proxy) allowed(target, role string) {
	p.log.Debug("egress allowed", zap.String("target", target), zap.String("role", role))
	if p.o.LogAllowed {
		p.jobLog("orch: egress " + target)
	}
}

// refuse answers a refused request with status and a body saying why,
// writes the denial into the job's log and counts it.
func (p *Proxy) refuse(w http.ResponseWriter, status int, target, reason string) {
	p.denied(target, reason)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Proxy-Error", "blocked-by-allowlist")
	w.WriteHeader(status)
	fmt.Fprintf(w, "orch egress proxy: %s is not allowed: %s\n", target, reason)
}

// denied logs and counts one refusal.
func (p *Proxy) denied(target, reason string) {
	p.log.Info("egress denied", zap.String("target", target), zap.String("reason", reason))
	p.jobLog("orch: egress denied " + target)
	if p.o.OnDenied != nil {
		p.o.OnDenied(target)
	}
}

// quoteTarget makes a target the agent wrote safe to log: bounded and
// without control characters.
func quoteTarget(s string) string {
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	clean := true
	for _, r := range s {
		if r < 0x21 || r == 0x7f || r > 0x7e {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	return fmt.Sprintf("%q", s)
}
