package ui

import (
	"testing"
	"time"
)

func TestLocalNextStaysOnTheDashboard(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                          "/ui/",
		"/ui/jobs/abc":              "/ui/jobs/abc",
		"/ui/?state=failed&page=2":  "/ui/?state=failed&page=2",
		"https://evil.example/ui/":  "/ui/",
		"//evil.example/ui/":        "/ui/",
		"/\\evil.example":           "/ui/",
		"/metrics":                  "/ui/",
		"/ui/../metrics":            "/ui/",
		"javascript:alert(1)":       "/ui/",
		"/ui/jobs/x\r\nSet-Cookie:": "/ui/",
		"ui/jobs/x":                 "/ui/",
	} {
		if got := localNext(in); got != want {
			t.Errorf("localNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSessionRefusesTamperedExpiredAndOtherTokens(t *testing.T) {
	t.Parallel()
	k := newKeys("token-a")
	now := time.Unix(1_700_000_000, 0)
	v := k.newSession(now.Add(time.Hour))
	nonce, ok := k.session(v, now)
	if !ok {
		t.Fatal("a fresh session is refused")
	}
	if !k.csrfOK(nonce, k.csrf(nonce)) || k.csrfOK(nonce, "") || k.csrfOK(nonce, k.csrf("other")) {
		t.Error("CSRF tokens are not bound to the session")
	}
	if _, ok := k.session(v, now.Add(2*time.Hour)); ok {
		t.Error("an expired session is accepted")
	}
	if _, ok := newKeys("token-b").session(v, now); ok {
		t.Error("a session survives a change of the API token")
	}
	tampered := v[:len(v)-2] + "xx"
	if _, ok := k.session(tampered, now); ok {
		t.Error("a tampered session is accepted")
	}
	if k.tokenOK("") || !k.tokenOK("token-a") || newKeys("").tokenOK("") {
		t.Error("tokenOK is wrong")
	}
}
