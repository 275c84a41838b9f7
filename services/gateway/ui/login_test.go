package ui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/throttle"
	"github.com/orch-dev/orch/services/gateway/ui"
)

func TestLoginLinkWorksOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	link := e.loginLink("")
	if !strings.HasPrefix(link, "/ui/login/") || strings.Contains(link, apiToken) {
		t.Fatalf("login link %q: want /ui/login/<secret>, without the token", link)
	}
	c := e.client()
	a := c.get(link)
	if a.code != http.StatusSeeOther || a.header.Get("Location") != "/ui/" {
		t.Fatalf("first use: %d to %q, want 303 to /ui/", a.code, a.header.Get("Location"))
	}
	cookie := a.header.Get("Set-Cookie")
	for _, attr := range []string{"orch_session=", "Path=/ui/", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(cookie, attr) {
			t.Errorf("cookie %q lacks %s", cookie, attr)
		}
	}
	secret := strings.TrimPrefix(link, "/ui/login/")
	if strings.Contains(cookie, secret) || strings.Contains(cookie, apiToken) {
		t.Errorf("the cookie %q carries the link's secret or the token", cookie)
	}
	if a := c.get("/ui/"); a.code != http.StatusOK {
		t.Errorf("queue page after login: %d", a.code)
	}

	// The second use, by anyone, logs no one in.
	other := e.client()
	a = other.get(link)
	if a.code != http.StatusUnauthorized || a.header.Get("Set-Cookie") != "" || !strings.Contains(a.body, "used already") {
		t.Errorf("second use: %d, cookie %q, body %s", a.code, a.header.Get("Set-Cookie"), a.body)
	}
	if a := other.get("/ui/"); a.code != http.StatusSeeOther {
		t.Errorf("a spent link gave a session: %d", a.code)
	}
	// A link never made, or not even shaped like one.
	for _, bad := range []string{"/ui/login/" + strings.Repeat("A", len(secret)), "/ui/login/x"} {
		if a := other.get(bad); a.code != http.StatusUnauthorized || a.header.Get("Set-Cookie") != "" {
			t.Errorf("GET %s: %d, cookie %q", bad, a.code, a.header.Get("Set-Cookie"))
		}
	}
}

func TestLoginLinkRaceHasOneWinner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	for range 3 {
		link := e.loginLink("")
		const n = 8
		codes := make([]int, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			c := e.client()
			wg.Go(func() {
				<-start
				resp, err := c.http.Get(e.url + link)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				codes[i] = resp.StatusCode
				if resp.StatusCode == http.StatusSeeOther && resp.Header.Get("Set-Cookie") == "" {
					t.Error("a 303 without a session cookie")
				}
			})
		}
		close(start)
		wg.Wait()
		won := 0
		for _, code := range codes {
			switch code {
			case http.StatusSeeOther:
				won++
			case http.StatusUnauthorized:
			default:
				t.Errorf("a racing use answered %d", code)
			}
		}
		if won != 1 {
			t.Fatalf("%d of %d racing uses of one link logged in (%v), want 1", won, n, codes)
		}
		e.clock.advance(throttle.WindowDefault) // the losers' failures count no more
	}
}

func TestLoginLinkExpiresAfterTenMinutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	early, late := e.loginLink(""), e.loginLink("")
	e.clock.advance(ui.LinkTTL - time.Minute)
	if a := e.client().get(early); a.code != http.StatusSeeOther {
		t.Errorf("a link used after 9 minutes: %d, want 303", a.code)
	}
	e.clock.advance(time.Minute)
	a := e.client().get(late)
	if a.code != http.StatusUnauthorized || a.header.Get("Set-Cookie") != "" || !strings.Contains(a.body, "expired") {
		t.Errorf("a link used after 10 minutes: %d, cookie %q", a.code, a.header.Get("Set-Cookie"))
	}
}

func TestLoginLinkKeepsALocalNext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	for _, tc := range []struct{ next, want string }{
		{"/ui/jobs/abc", "/ui/jobs/abc"},
		{"/ui/?state=failed", "/ui/?state=failed"},
		{"https://evil.example/ui/", "/ui/"},
		{"//evil.example/", "/ui/"},
	} {
		link := e.loginLink(tc.next)
		a := e.client().get(link)
		if a.code != http.StatusSeeOther || a.header.Get("Location") != tc.want {
			t.Errorf("next=%q: %s answered %d to %q, want 303 to %q", tc.next, link, a.code, a.header.Get("Location"), tc.want)
		}
	}
	// A next edited into the link is checked all the same.
	link := e.loginLink("") + "?next=" + url.QueryEscape("https://evil.example/")
	if a := e.client().get(link); a.header.Get("Location") != "/ui/" {
		t.Errorf("edited next: to %q, want /ui/", a.header.Get("Location"))
	}
}

func TestLoginLinkIsAbsoluteUnderThePublicURL(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(c *gateway.Config) { c.PublicURL = "https://orch.example.com/" })
	link := e.loginLink("/ui/jobs/j1")
	if !strings.HasPrefix(link, "https://orch.example.com/ui/login/") || !strings.HasSuffix(link, "?next=%2Fui%2Fjobs%2Fj1") {
		t.Errorf("link %q, want https://orch.example.com/ui/login/<secret>?next=...", link)
	}
	code, body := e.makeLink("/ui/login-links", apiToken)
	var ans map[string]any
	if code != http.StatusOK || json.Unmarshal([]byte(body), &ans) != nil || ans["expires_at"] == nil {
		t.Errorf("POST /ui/login-links: %d %s", code, body)
	}
}

func TestLoginLinksNeedTheToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	for _, token := range []string{"", "wrong"} {
		if code, body := e.makeLink("/ui/login-links", token); code != http.StatusUnauthorized || strings.Contains(body, "/ui/login/") {
			t.Errorf("POST /ui/login-links with token %q: %d %s", token, code, body)
		}
	}
	off := newEnv(t, "")
	if code, _ := off.makeLink("/ui/login-links", apiToken); code != http.StatusForbidden {
		t.Errorf("POST /ui/login-links with the dashboard off: %d, want 403", code)
	}
}

func TestTheOldTokenLinkLogsNoOneIn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	c := e.client()
	a := c.get("/ui/login?token=" + url.QueryEscape(apiToken) + "&next=/ui/jobs/j1")
	if a.code != http.StatusBadRequest || a.header.Get("Set-Cookie") != "" {
		t.Errorf("GET /ui/login?token=<the right token>: %d, cookie %q; want 400 and no session", a.code, a.header.Get("Set-Cookie"))
	}
	if !strings.Contains(a.body, "POST /ui/login-links") || !strings.Contains(a.body, "make run") {
		t.Errorf("the answer does not say where login links come from: %s", a.body)
	}
	if a := c.get("/ui/"); a.code != http.StatusSeeOther {
		t.Errorf("the old link gave a session: %d", a.code)
	}
}

func TestLogoutEndsTheSessionOnTheServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	c := e.loggedIn()
	u, _ := url.Parse(e.url + "/ui/")
	var session string
	for _, ck := range c.http.Jar.Cookies(u) {
		if ck.Name == ui.SessionCookie {
			session = ck.Value
		}
	}
	if session == "" {
		t.Fatal("no session cookie after login")
	}
	// The bucket holds the session, by a hash: not the cookie's secret.
	sessions, err := e.js.KeyValue(context.Background(), proto.BucketUISessions)
	if err != nil {
		t.Fatal(err)
	}
	keys := sessionKeys(t, sessions)
	if len(keys) != 1 || strings.Contains(keys[0], session) {
		t.Fatalf("bucket keys %v after one login (cookie %q)", keys, session)
	}

	// A copy of the cookie works as long as the session does.
	copied := func() answer {
		req, _ := http.NewRequest(http.MethodGet, e.url+"/ui/", nil)
		req.AddCookie(&http.Cookie{Name: ui.SessionCookie, Value: session})
		return e.client().do(req)
	}
	if a := copied(); a.code != http.StatusOK {
		t.Fatalf("copied cookie before logout: %d", a.code)
	}
	csrf := c.csrf("/ui/")
	if a := c.post("/ui/logout", url.Values{"csrf": {csrf}}); a.code != http.StatusSeeOther {
		t.Fatalf("logout: %d %s", a.code, a.body)
	}
	if a := c.get("/ui/"); a.code != http.StatusSeeOther {
		t.Errorf("still logged in after logout: %d", a.code)
	}
	if a := copied(); a.code != http.StatusSeeOther || !strings.HasPrefix(a.header.Get("Location"), "/ui/login") {
		t.Errorf("the copied cookie still works after logout: %d", a.code)
	}
	if keys := sessionKeys(t, sessions); len(keys) != 0 {
		t.Errorf("bucket keys %v after logout, want none", keys)
	}
}

func sessionKeys(t *testing.T, kv jetstream.KeyValue) []string {
	t.Helper()
	keys, err := kv.Keys(context.Background())
	if err != nil && err != jetstream.ErrNoKeysFound {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, "session.") {
			out = append(out, k)
		}
	}
	return out
}

func TestSessionEndsAfterTwelveHours(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	c := e.loggedIn()
	e.clock.advance(ui.SessionTTL - time.Minute)
	if a := c.get("/ui/"); a.code != http.StatusOK {
		t.Errorf("after 11h59m: %d, want 200", a.code)
	}
	e.clock.advance(time.Minute)
	if a := c.get("/ui/"); a.code != http.StatusSeeOther {
		t.Errorf("after 12h: %d, want 303 to the login", a.code)
	}
}

func TestFailedLoginsAreThrottled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	good := e.loginLink("")
	c := e.client()
	for i := range throttle.FailuresDefault {
		var a answer
		if i%2 == 0 {
			a = c.get("/ui/login/" + strings.Repeat("x", 43))
		} else {
			a = c.post("/ui/login", url.Values{"token": {"wrong"}})
		}
		if a.code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, a.code)
		}
	}
	// Refused before it is looked at: the good link, and the right token.
	for what, a := range map[string]answer{
		"a good link":     c.get(good),
		"the right token": c.post("/ui/login", url.Values{"token": {apiToken}}),
	} {
		wait, _ := strconv.Atoi(a.header.Get("Retry-After"))
		if a.code != http.StatusTooManyRequests || wait < 1 || wait > 60 || a.header.Get("Set-Cookie") != "" {
			t.Errorf("%s after %d failures: %d, Retry-After %q", what, throttle.FailuresDefault, a.code, a.header.Get("Retry-After"))
		}
		if !strings.Contains(a.body, "Too many failed logins") {
			t.Errorf("%s: the 429 page does not say why: %s", what, a.body)
		}
	}
	// Once the window has passed, the good link still works.
	e.clock.advance(throttle.WindowDefault)
	if a := c.get(good); a.code != http.StatusSeeOther {
		t.Errorf("the good link after the window: %d, want 303", a.code)
	}
}

func TestLoginFormTakesTheToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	c := e.client()
	if a := c.get("/ui/login?next=/ui/dead-letters"); a.code != http.StatusOK || !strings.Contains(a.body, `name="next" value="/ui/dead-letters"`) {
		t.Fatalf("login form: %d %s", a.code, a.body)
	}
	if a := c.post("/ui/login", url.Values{"token": {"nope"}, "next": {"/ui/dead-letters"}}); a.code != http.StatusUnauthorized || !strings.Contains(a.body, "not right") {
		t.Errorf("wrong token: %d", a.code)
	}
	// Right after /readyz, before the gateway has reached the login store
	// (KV ui_sessions): the login waits for it.
	a := c.post("/ui/login", url.Values{"token": {apiToken}, "next": {"/ui/dead-letters"}})
	if a.code != http.StatusSeeOther || a.header.Get("Location") != "/ui/dead-letters" {
		t.Fatalf("login: %d to %q", a.code, a.header.Get("Location"))
	}
	if a := c.get("/ui/dead-letters"); a.code != http.StatusOK {
		t.Errorf("dead letters after login: %d", a.code)
	}
}
