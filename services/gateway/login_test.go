package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/throttle"
	"github.com/orch-dev/orch/services/gateway/ui"
)

// browser is an HTTP client that does not follow redirects, so a test
// sees the login's 303 and its cookie; from, when set, is the loopback
// address it connects from (another client, as the gateway sees it).
func browser(t *testing.T, from string) *http.Client {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	return &http.Client{
		Timeout:       30 * time.Second,
		Transport:     &http.Transport{DialContext: d.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// call sends a request with the headers and returns the answer.
func call(t *testing.T, c *http.Client, method, url string, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Skip("cannot connect from another loopback address than 127.0.0.1 on this system")
		}
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// loginLink makes a login link on g with the API token, waiting while g
// has not reached its bucket yet.
func (g *gw) loginLink(t *testing.T) string {
	t.Helper()
	var link ui.LoginLink
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		resp, body := call(t, http.DefaultClient, http.MethodPost, g.url+"/ui/login-links", map[string]string{"Authorization": "Bearer " + apiToken})
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status + " " + body)
		}
		return json.Unmarshal([]byte(body), &link)
	})
	return link.Link
}

// sessionCookie is the session a login's answer sets, "" for none.
func sessionCookie(resp *http.Response) string {
	for _, c := range resp.Cookies() {
		if c.Name == ui.SessionCookie && c.Value != "" {
			return c.Value
		}
	}
	return ""
}

// page GETs a dashboard page with the session cookie.
func page(t *testing.T, g *gw, session string) int {
	t.Helper()
	resp, _ := call(t, browser(t, ""), http.MethodGet, g.url+"/ui/", map[string]string{"Cookie": ui.SessionCookie + "=" + session})
	return resp.StatusCode
}

// Two replicas behind one load balancer share the bucket of logins: a link
// made on one logs in on the other, once, and a logout on one ends the
// session on both.
func TestLoginLinkFromOneGatewayLogsInOnAnother(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	one := e.start()
	two := (&env{t: t, srv: e.srv, dataDir: t.TempDir(), projects: e.projects, token: e.token, clock: e.clock}).start()
	one.ready(t)
	two.ready(t)

	link := one.loginLink(t)
	resp, _ := call(t, browser(t, ""), http.MethodGet, two.url+link, nil)
	session := sessionCookie(resp)
	if resp.StatusCode != http.StatusSeeOther || session == "" {
		t.Fatalf("link of one used on two: %d, cookie %q; want 303 and a session", resp.StatusCode, session)
	}
	for _, g := range []*gw{one, two} {
		resp, _ := call(t, browser(t, ""), http.MethodGet, g.url+link, nil)
		if resp.StatusCode != http.StatusUnauthorized || sessionCookie(resp) != "" {
			t.Errorf("link used again on %s: %d, want 401", g.url, resp.StatusCode)
		}
		if code := page(t, g, session); code != http.StatusOK {
			t.Errorf("the session on %s: %d, want 200", g.url, code)
		}
	}

	// Log out on one: the cookie is refused by two as well.
	_, body := call(t, browser(t, ""), http.MethodGet, one.url+"/ui/", map[string]string{"Cookie": ui.SessionCookie + "=" + session})
	csrf := strings.SplitN(strings.SplitN(body, `name="csrf" value="`, 2)[1], `"`, 2)[0]
	req, _ := http.NewRequest(http.MethodPost, one.url+"/ui/logout", strings.NewReader("csrf="+csrf))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Cookie", ui.SessionCookie+"="+session)
	out, err := browser(t, "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out.Body.Close()
	if out.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout on one: %d", out.StatusCode)
	}
	if code := page(t, two, session); code != http.StatusSeeOther {
		t.Errorf("the session on two after logout on one: %d, want 303 to the login", code)
	}
}

func TestWrongBearerTokensAreThrottledPerClient(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	mallory, alice := browser(t, ""), browser(t, "127.0.0.2")
	wrong := map[string]string{"Authorization": "Bearer " + strings.Repeat("x", 40)}
	right := map[string]string{"Authorization": "Bearer " + apiToken}
	for i := range throttle.FailuresDefault {
		if resp, body := call(t, mallory, http.MethodGet, g.url+"/queue", wrong); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d %s, want 401", i+1, resp.StatusCode, body)
		}
	}
	// Now every attempt of that client is refused before it is looked at,
	// the right token included, on every endpoint that takes the token.
	for _, rq := range []struct {
		method, path string
		h            map[string]string
	}{
		{http.MethodGet, "/queue", wrong}, {http.MethodGet, "/queue", right},
		{http.MethodGet, "/jobs/nope", right}, {http.MethodPost, "/ui/login-links", right},
	} {
		resp, body := call(t, mallory, rq.method, g.url+rq.path, rq.h)
		wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || wait < 1 || wait > int(throttle.WindowDefault/time.Second) {
			t.Errorf("%s %s after %d failures: %d (Retry-After %q) %s, want 429", rq.method, rq.path,
				throttle.FailuresDefault, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if strings.Contains(body, apiToken) {
			t.Errorf("the answer shows the token: %s", body)
		}
	}
	// Another client is not throttled: a wrong token is a 401, the right
	// one works.
	if resp, _ := call(t, alice, http.MethodGet, g.url+"/queue", wrong); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("another client's wrong token: %d, want 401", resp.StatusCode)
	}
	if resp, _ := call(t, alice, http.MethodGet, g.url+"/queue", right); resp.StatusCode != http.StatusOK {
		t.Errorf("another client's right token: %d, want 200", resp.StatusCode)
	}
	// X-Forwarded-For is not believed from a client that is no trusted
	// proxy: mallory cannot pass for someone else.
	if resp, _ := call(t, mallory, http.MethodGet, g.url+"/queue", map[string]string{
		"Authorization": right["Authorization"], "X-Forwarded-For": "203.0.113.9",
	}); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("mallory behind a made-up X-Forwarded-For: %d, want 429", resp.StatusCode)
	}
	// After the window the right token works again.
	e.clock.advance(throttle.WindowDefault)
	if resp, body := call(t, mallory, http.MethodGet, g.url+"/queue", right); resp.StatusCode != http.StatusOK {
		t.Errorf("the right token after the window: %d %s, want 200", resp.StatusCode, body)
	}
}

func TestShortAPITokenStopsTheGateway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		token, proxies string
		want           string // in the error; "" for none
	}{
		{"", "", ""},
		{strings.Repeat("k", gateway.APITokenMinLength), "", ""},
		{"t0ken", "", "ORCH_API_TOKEN is 5 characters, want at least 32"},
		{strings.Repeat("k", gateway.APITokenMinLength-1), "", "ORCH_API_TOKEN is 31 characters"},
		{apiToken, "10.0.0.0/8, 192.0.2.7,::1", ""},
		{apiToken, "10.0.0.0/8,proxy.local", `ORCH_TRUSTED_PROXIES: "proxy.local" is neither an address nor a network`},
	} {
		cfg := service.Default[gateway.Config]()
		cfg.GiteaSecret, cfg.PlaneSecret, cfg.APIToken = "g", "p", tc.token
		cfg.TrustedProxies = strings.Split(tc.proxies, ",")
		err := cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("token of %d characters, proxies %q: %v, want %q", len(tc.token), tc.proxies, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), tc.token) && tc.token != "" {
			t.Errorf("the error shows the token: %v", err)
		}
	}

	// Run stops at once, before it listens, and says why.
	e := newEnv(t)
	ln := testkit.Listen(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := gateway.Run(ctx, gateway.Config{
		Common:   service.Common{NATSURL: e.srv.URL(), DataDir: e.dataDir},
		Listener: ln, ProjectsFile: e.projects, GiteaSecret: giteaSecret, PlaneSecret: planeSecret, APIToken: "secret",
	}, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "ORCH_API_TOKEN is 6 characters, want at least 32") {
		t.Errorf("gateway.Run with a 6-character token: %v", err)
	}
}

// Logins need NATS (the sessions are there); the API's bearer token does
// not.
func TestLoginWaitsForNATSButTheAPIDoesNot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.Shutdown()
	g := e.start()
	auth := map[string]string{"Authorization": "Bearer " + apiToken}
	resp, body := call(t, http.DefaultClient, http.MethodPost, g.url+"/ui/login-links", auth)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "not reachable") {
		t.Errorf("POST /ui/login-links without NATS: %d %s, want 503 saying why", resp.StatusCode, body)
	}
	if resp, body := call(t, http.DefaultClient, http.MethodGet, g.url+"/queue", auth); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /queue with the token without NATS: %d %s, want 200", resp.StatusCode, body)
	}
	form := strings.NewReader("token=" + apiToken)
	req, _ := http.NewRequest(http.MethodPost, g.url+"/ui/login", form)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	out, err := browser(t, "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if out.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(page), "cannot reach NATS") {
		t.Errorf("the login form without NATS: %d %s, want 503 saying why", out.StatusCode, page)
	}

	// Once NATS is back, so are logins.
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	link := g.loginLink(t)
	if resp, _ := call(t, browser(t, ""), http.MethodGet, g.url+link, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("login after NATS came back: %d", resp.StatusCode)
	}
}
