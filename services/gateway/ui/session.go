package ui

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/orch-dev/orch/proto"
)

// A session is a random secret in a cookie and a record in the bucket
// proto.BucketUISessions (see store.go): every gateway replica accepts it,
// logout ends it everywhere, and a restart logs no one out. A browser gets
// one from a single-use login link (POST /ui/login-links with the API
// token makes one; make run prints one) or from the login form, which
// takes the API token itself.
//
// The cookie is HttpOnly (page scripts never see it), SameSite=Strict (no
// other site can make the browser send it, which is the first line against
// CSRF), scoped to /ui/, and Secure when the request came over HTTPS
// (directly or, per X-Forwarded-Proto, through a proxy). Every POST also
// carries a CSRF token derived from the session's secret, checked in
// constant time: a second line that holds even for a browser that ignores
// SameSite.

// SessionCookie is the name of the dashboard's session cookie.
const SessionCookie = "orch_session"

// SessionTTL is how long a session lasts after login: the TTL of the
// bucket the sessions live in.
const SessionTTL = proto.UISessionTTL

// csrfField is the form field that carries the CSRF token.
const csrfField = "csrf"

// keys are the API token and the HMAC key of CSRF tokens, derived from the
// token so that a CSRF token is never the token itself.
type keys struct {
	token   []byte
	csrfKey []byte
}

func newKeys(token string) keys {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("orch dashboard csrf key"))
	return keys{token: []byte(token), csrfKey: mac.Sum(nil)}
}

// tokenOK reports whether got is the API token, in constant time.
func (k keys) tokenOK(got string) bool {
	return len(k.token) > 0 && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), k.token) == 1
}

// csrf is the CSRF token of the session whose cookie carries secret.
func (k keys) csrf(secret string) string {
	mac := hmac.New(sha256.New, k.csrfKey)
	mac.Write([]byte("csrf|" + secret))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// csrfOK reports whether got is the CSRF token of the session of secret.
func (k keys) csrfOK(secret, got string) bool {
	return got != "" && hmac.Equal([]byte(got), []byte(k.csrf(secret)))
}

// secure reports whether the browser reached us over HTTPS.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// startSession records a new session and gives the browser its cookie.
func (h *Handler) startSession(w http.ResponseWriter, r *http.Request) error {
	secret, err := h.store.newSession(r.Context(), h.now())
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: secret, Path: Prefix,
		MaxAge: int(SessionTTL / time.Second), HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
	return nil
}

func (h *Handler) clearSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
}

// sessionOf returns the secret of the request's session: errUnknown
// without a good one, errUnavailable when the bucket cannot tell.
func (h *Handler) sessionOf(r *http.Request) (string, error) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return "", errUnknown
	}
	if err := h.store.session(r.Context(), c.Value, h.now()); err != nil {
		return "", err
	}
	return c.Value, nil
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
