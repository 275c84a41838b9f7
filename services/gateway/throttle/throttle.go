// Package throttle slows down guessing. It counts each client's failed
// attempts at the gateway's secrets (a wrong bearer token on any endpoint
// that takes ORCH_API_TOKEN, a wrong token in the dashboard's login form, a
// login link that is unknown, spent or expired) and refuses the client for
// the rest of a short window once it has failed a few times in it.
//
// A refused client is refused before its attempt is looked at, the right
// token included: otherwise the throttle would only slow the answers down,
// not the guessing. Once the window has passed the client may try again.
//
// The count lives in memory, per gateway: behind a load balancer each
// replica throttles on its own, so a client gets at most that many more
// tries. Memory is bounded by Clients: under an attack from many addresses
// the client whose last failure is oldest is forgotten first.
//
// The client is the connection's remote address, IPv6 addresses taken by
// their /64 (one host usually holds a whole /64). X-Forwarded-For is read
// only from a connection whose remote address is in TrustedProxies, and then
// the client is the last address in it that is not a trusted proxy: anyone
// can send the header, and believing it would let a guesser be anyone.
package throttle

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Defaults of Config.
const (
	// FailuresDefault is how many failed attempts a client may make in
	// one window; the next is refused with 429 until the window ends.
	FailuresDefault = 10
	// WindowDefault is how long a window lasts, from the client's first
	// failed attempt in it.
	WindowDefault = time.Minute
	// ClientsDefault bounds how many clients are remembered at once.
	ClientsDefault = 10_000
)

// Config is a Limiter's configuration; zero fields take their defaults.
type Config struct {
	// Failures a client may make in a Window. Zero means FailuresDefault.
	Failures int
	// Window is how long failures count. Zero means WindowDefault.
	Window time.Duration
	// Clients bounds the clients remembered. Zero means ClientsDefault.
	Clients int
	// TrustedProxies are the proxies whose X-Forwarded-For names the
	// client. Empty: the client is always the connection's address.
	TrustedProxies []netip.Prefix
	// Log gets a warning when a client starts to be refused.
	Log *zap.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Limiter counts failed attempts per client. A nil *Limiter throttles
// nothing. Its methods may be called from any goroutine.
type Limiter struct {
	cfg Config

	mu      sync.Mutex
	clients map[string]*list.Element // of *client
	order   *list.List               // least recently failed first
}

// client is one client's failures in its current window.
type client struct {
	key      string
	start    time.Time // the first failure of the window
	failures int
}

// New returns a Limiter.
func New(cfg Config) *Limiter {
	if cfg.Failures <= 0 {
		cfg.Failures = FailuresDefault
	}
	if cfg.Window <= 0 {
		cfg.Window = WindowDefault
	}
	if cfg.Clients <= 0 {
		cfg.Clients = ClientsDefault
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Limiter{cfg: cfg, clients: map[string]*list.Element{}, order: list.New()}
}

// Wait reports how long the client that sent r must wait before its next
// attempt is looked at: zero when it may try now.
func (l *Limiter) Wait(r *http.Request) time.Duration {
	if l == nil {
		return 0
	}
	key := l.Client(r)
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.clients[key]
	if !ok {
		return 0
	}
	c := e.Value.(*client)
	end := c.start.Add(l.cfg.Window)
	if c.failures < l.cfg.Failures || !now.Before(end) {
		return 0
	}
	return end.Sub(now)
}

// Fail records a failed attempt (what: "bearer token", "login link", ...)
// of the client that sent r. The failure that uses up the client's window
// is logged at warn; the secret that was tried never is.
func (l *Limiter) Fail(r *http.Request, what string) {
	if l == nil {
		return
	}
	key := l.Client(r)
	now := l.cfg.Now()
	l.mu.Lock()
	e, ok := l.clients[key]
	if ok {
		l.order.MoveToBack(e)
	} else {
		if l.order.Len() >= l.cfg.Clients {
			oldest := l.order.Front()
			delete(l.clients, oldest.Value.(*client).key)
			l.order.Remove(oldest)
		}
		e = l.order.PushBack(&client{key: key, start: now})
		l.clients[key] = e
	}
	c := e.Value.(*client)
	if !now.Before(c.start.Add(l.cfg.Window)) {
		c.start, c.failures = now, 0
	}
	c.failures++
	full := c.failures == l.cfg.Failures
	wait := c.start.Add(l.cfg.Window).Sub(now)
	l.mu.Unlock()
	if full {
		l.cfg.Log.Warn("too many failed attempts: refusing the client until its window ends",
			zap.String("client", key), zap.String("attempt", what), zap.String("path", r.URL.Path),
			zap.Int("failures", l.cfg.Failures), zap.Duration("window", l.cfg.Window), zap.Duration("retry_after", wait))
	}
}

// Len is how many clients the Limiter remembers.
func (l *Limiter) Len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// RetryAfter sets the Retry-After header of a 429 for wait: whole
// seconds, rounded up, at least one.
func RetryAfter(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(Seconds(wait)))
}

// Seconds is wait in whole seconds, rounded up, at least one.
func Seconds(wait time.Duration) int {
	return max(1, int(math.Ceil(wait.Seconds())))
}

// Client is the key of the client that sent r (see the package doc). A
// nil Limiter trusts no proxy.
func (l *Limiter) Client(r *http.Request) string {
	addr := remote(r.RemoteAddr)
	if l.trusted(addr) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // a garbled hop: the last good one stands
			}
			addr = hop.Unmap()
			if !l.trusted(addr) {
				break
			}
		}
	}
	if !addr.IsValid() {
		return r.RemoteAddr
	}
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

func (l *Limiter) trusted(addr netip.Addr) bool {
	if l == nil {
		return false
	}
	for _, p := range l.cfg.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// remote is the address of a RemoteAddr ("ip:port"), invalid when it is
// not one.
func remote(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	a, _ := netip.ParseAddr(s)
	return a.Unmap()
}

// ParseProxies reads a list of trusted proxies, each an address
// (10.0.0.7) or a network (10.0.0.0/8).
func ParseProxies(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q is neither an address nor a network (10.0.0.0/8)", s))
			continue
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, errors.Join(errs...)
}
