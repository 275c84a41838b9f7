package ui

import (
	"strings"
	"testing"
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

func TestCSRFTokensAreBoundToTheSessionAndTheAPIToken(t *testing.T) {
	t.Parallel()
	k := newKeys("token-a")
	secret := newSecret()
	if !k.csrfOK(secret, k.csrf(secret)) || k.csrfOK(secret, "") || k.csrfOK(secret, k.csrf(newSecret())) {
		t.Error("CSRF tokens are not bound to the session")
	}
	if newKeys("token-b").csrfOK(secret, k.csrf(secret)) {
		t.Error("a CSRF token survives a change of the API token")
	}
	if k.tokenOK("") || !k.tokenOK("token-a") || newKeys("").tokenOK("") {
		t.Error("tokenOK is wrong")
	}
}

func TestSecretsAreRandomAndStoredOnlyAsHashes(t *testing.T) {
	t.Parallel()
	a, b := newSecret(), newSecret()
	if a == b || len(a) < 43 { // 43 base64 characters: 256 bits
		t.Fatalf("secrets %q and %q", a, b)
	}
	if k := keyOf(kindLink, a); strings.Contains(k, a) || k != keyOf(kindLink, a) || k == keyOf(kindSession, a) {
		t.Errorf("key %q of secret %q", k, a)
	}
}
