package throttle

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func request(remote string, xff ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/queue", nil)
	r.RemoteAddr = remote
	for _, h := range xff {
		r.Header.Add("X-Forwarded-For", h)
	}
	return r
}

func TestAClientIsRefusedAfterItsFailuresUntilTheWindowEnds(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	core, logs := observer.New(zap.WarnLevel)
	l := New(Config{Failures: 3, Window: time.Minute, Now: clk.now, Log: zap.New(core)})
	mallory, alice := request("192.0.2.1:5000"), request("192.0.2.2:5000")
	for i := range 3 {
		if w := l.Wait(mallory); w != 0 {
			t.Fatalf("refused after %d failures (wait %v)", i, w)
		}
		l.Fail(mallory, "bearer token")
		clk.t = clk.t.Add(10 * time.Second)
	}
	// The window started with the first failure, 30 s ago.
	if w := l.Wait(mallory); w != 30*time.Second {
		t.Errorf("after 3 failures: wait %v, want 30s", w)
	}
	if w := l.Wait(request("192.0.2.1:6000")); w == 0 {
		t.Error("another port of the same address is not throttled")
	}
	if w := l.Wait(alice); w != 0 {
		t.Errorf("another client waits %v", w)
	}
	if n := logs.FilterMessageSnippet("too many failed attempts").Len(); n != 1 {
		t.Errorf("%d warnings, want one when the client starts to be refused", n)
	}
	clk.t = clk.t.Add(30 * time.Second)
	if w := l.Wait(mallory); w != 0 {
		t.Errorf("after the window: wait %v", w)
	}
	// A new window starts with the next failure.
	l.Fail(mallory, "bearer token")
	if w := l.Wait(mallory); w != 0 {
		t.Errorf("one failure into a new window: wait %v", w)
	}
}

func TestRetryAfterIsWholeSecondsRoundedUp(t *testing.T) {
	t.Parallel()
	for wait, want := range map[time.Duration]string{time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", time.Minute: "60"} {
		w := httptest.NewRecorder()
		RetryAfter(w, wait)
		if got := w.Header().Get("Retry-After"); got != want {
			t.Errorf("RetryAfter(%v) = %q, want %q", wait, got, want)
		}
	}
}

func TestManyClientsTakeBoundedMemory(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	l := New(Config{Failures: 2, Clients: 100, Now: clk.now})
	first := request("198.51.100.1:1")
	l.Fail(first, "x")
	l.Fail(first, "x")
	for i := range 10_000 {
		l.Fail(request(fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255)), "x")
		if l.Len() > 100 {
			t.Fatalf("%d clients remembered, bound 100", l.Len())
		}
	}
	if l.Wait(first) != 0 {
		t.Error("the client that failed longest ago is still remembered")
	}
	last := request("10.0.39.15:1") // the 10,000th
	l.Fail(last, "x")
	if l.Wait(last) == 0 {
		t.Error("a recent client was forgotten")
	}
}

func TestTheClientIsTheConnectionUnlessAProxyIsTrusted(t *testing.T) {
	t.Parallel()
	proxies, err := ParseProxies([]string{"10.0.0.0/8", " 192.0.2.7 ", "", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	trusting := New(Config{TrustedProxies: proxies})
	for _, tc := range []struct {
		l      *Limiter
		remote string
		xff    []string
		want   string
	}{
		{New(Config{}), "203.0.113.5:443", nil, "203.0.113.5"},
		{New(Config{}), "203.0.113.5:443", []string{"198.51.100.9"}, "203.0.113.5"},              // a header anyone can send
		{trusting, "203.0.113.5:443", []string{"198.51.100.9"}, "203.0.113.5"},                   // not from a proxy
		{trusting, "10.1.2.3:443", []string{"198.51.100.9"}, "198.51.100.9"},                     // from the proxy
		{trusting, "10.1.2.3:443", []string{"6.6.6.6, 198.51.100.9, 192.0.2.7"}, "198.51.100.9"}, // the last hop not a proxy
		{trusting, "10.1.2.3:443", []string{"6.6.6.6", "198.51.100.9"}, "198.51.100.9"},          // several headers
		{trusting, "10.1.2.3:443", []string{"garbage"}, "10.1.2.3"},
		{trusting, "10.1.2.3:443", nil, "10.1.2.3"},
		{New(Config{}), "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::/64"},
		{New(Config{}), "[::ffff:203.0.113.5]:443", nil, "203.0.113.5"},
		{nil, "203.0.113.5:443", []string{"198.51.100.9"}, "203.0.113.5"},
	} {
		if got := tc.l.Client(request(tc.remote, tc.xff...)); got != tc.want {
			t.Errorf("Client(%s, X-Forwarded-For %q) = %q, want %q", tc.remote, tc.xff, got, tc.want)
		}
	}
	if _, err := ParseProxies([]string{"10.0.0.0/8", "proxy.local"}); err == nil {
		t.Error("a host name is taken as a proxy")
	}
	if got := proxies[1]; got != netip.MustParsePrefix("192.0.2.7/32") {
		t.Errorf("an address is the network %v", got)
	}
}

func TestANilLimiterThrottlesNothing(t *testing.T) {
	t.Parallel()
	var l *Limiter
	r := request("192.0.2.1:1")
	for range 100 {
		l.Fail(r, "x")
	}
	if l.Wait(r) != 0 || l.Len() != 0 {
		t.Error("a nil Limiter throttles")
	}
}
