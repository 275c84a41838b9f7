package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// A session is a signed cookie, not server state: its value is a random
// nonce and an expiry, signed with a key derived from ORCH_API_TOKEN. So
// every gateway replica accepts the sessions of the others, a restart logs
// no one out, and changing the token ends every session at once.
//
// The cookie is HttpOnly (page scripts never see it), SameSite=Strict (no
// other site can make the browser send it, which is the first line against
// CSRF), scoped to /ui/, and Secure when the request came over HTTPS
// (directly or, per X-Forwarded-Proto, through a proxy). Every POST also
// carries a CSRF token derived from the session's nonce, checked in
// constant time: a second line that holds even for a browser that ignores
// SameSite.

// SessionCookie is the name of the dashboard's session cookie.
const SessionCookie = "orch_session"

// SessionTTL is how long a session lasts after login.
const SessionTTL = 12 * time.Hour

// csrfField is the form field that carries the CSRF token.
const csrfField = "csrf"

// keys are the HMAC keys of sessions and CSRF tokens, derived from the
// API token so that neither is the token itself.
type keys struct {
	token      []byte
	sessionKey []byte
}

func newKeys(token string) keys {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("orch dashboard session key"))
	return keys{token: []byte(token), sessionKey: mac.Sum(nil)}
}

func (k keys) sign(parts ...string) string {
	mac := hmac.New(sha256.New, k.sessionKey)
	mac.Write([]byte(strings.Join(parts, "|")))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// tokenOK reports whether got is the API token, in constant time.
func (k keys) tokenOK(got string) bool {
	return len(k.token) > 0 && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), k.token) == 1
}

// newSession returns a fresh cookie value valid until exp.
func (k keys) newSession(exp time.Time) string {
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	n := base64.RawURLEncoding.EncodeToString(nonce[:])
	e := strconv.FormatInt(exp.Unix(), 10)
	return n + "." + e + "." + k.sign("session", n, e)
}

// session checks a cookie value and returns its nonce.
func (k keys) session(value string, now time.Time) (nonce string, ok bool) {
	parts := strings.Split(value, ".")
	if len(parts) != 3 {
		return "", false
	}
	if !hmac.Equal([]byte(parts[2]), []byte(k.sign("session", parts[0], parts[1]))) {
		return "", false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() >= exp {
		return "", false
	}
	return parts[0], true
}

// csrf is the CSRF token of the session with nonce.
func (k keys) csrf(nonce string) string { return k.sign("csrf", nonce) }

// csrfOK reports whether got is the CSRF token of the session with nonce.
func (k keys) csrfOK(nonce, got string) bool {
	return got != "" && hmac.Equal([]byte(got), []byte(k.csrf(nonce)))
}

// secure reports whether the browser reached us over HTTPS.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (h *Handler) setSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: h.keys.newSession(h.now().Add(SessionTTL)), Path: Prefix,
		MaxAge: int(SessionTTL / time.Second), HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
}

func (h *Handler) clearSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
}

// sessionOf returns the nonce of the request's valid session.
func (h *Handler) sessionOf(r *http.Request) (string, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return "", false
	}
	return h.keys.session(c.Value, h.now())
}

// localNext returns where to go after login: next when it is a path of
// the dashboard on this host, the queue page otherwise. It never names
// another host, so a login link cannot send a person elsewhere.
func localNext(next string) string {
	if next == "" || strings.ContainsAny(next, "\\\r\n\t") || strings.HasPrefix(next, "//") {
		return Prefix
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return Prefix
	}
	clean := u.EscapedPath()
	if !strings.HasPrefix(clean, Prefix) || strings.Contains(clean, "/../") || strings.HasSuffix(clean, "/..") {
		return Prefix
	}
	if u.RawQuery != "" {
		clean += "?" + u.RawQuery
	}
	return clean
}

// sameOrigin rejects a POST whose Origin names another site. Browsers send
// Origin on every POST; a request without one (curl, an old browser) is
// judged by the CSRF token alone.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}
