package ui

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/services/gateway/throttle"
)

// How a browser logs in:
//
//   - A login link, /ui/login/<secret>: made by POST /ui/login-links with
//     the API token (make run prints one at start), good once and for
//     LinkTTL. Its answer is a redirect to a URL without the secret.
//   - The form at /ui/login, which takes the API token in the body of a
//     POST (never in a URL, so never in a proxy's log or the history).
//
// Both are throttled per client with the bearer token of the API: a
// client with too many failures in a window (a wrong token, a link that is
// unknown, spent or expired) is answered 429 with Retry-After. The old
// one-time link /ui/login?token=<API token> logs no one in: it put the
// permanent token in URLs.

// LoginLink is the answer of POST /ui/login-links.
type LoginLink struct {
	// Link logs a browser in once: an absolute URL under ORCH_PUBLIC_URL
	// when that is set, else a path on this gateway.
	Link string `json:"link"`
	// ExpiresAt is when the link stops working if it has not been used.
	ExpiresAt time.Time `json:"expires_at"`
}

// howToLogIn tells a person where login links come from.
const howToLogIn = "Login links are made by POST /ui/login-links with Authorization: Bearer $ORCH_API_TOKEN, " +
	"and make run prints one when it starts."

// makeLink answers POST /ui/login-links (behind the API token): a new
// login link, which lands on ?next= (a /ui/ path) after login.
func (h *Handler) makeLink(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	next := localNext(r.FormValue("next"))
	now := h.now()
	secret, err := h.store.newLink(r.Context(), now)
	if err != nil {
		h.cfg.Log.Warn("making a login link failed", zap.Error(err))
		writeJSONError(w, http.StatusServiceUnavailable, "cannot make a login link: "+err.Error())
		return
	}
	link := strings.TrimRight(h.cfg.PublicURL, "/") + Prefix + "login/" + secret
	if next != Prefix {
		link += "?next=" + url.QueryEscape(next)
	}
	h.cfg.Log.Info("login link made", zap.Time("expires_at", now.Add(LinkTTL)))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(LoginLink{Link: link, ExpiresAt: now.Add(LinkTTL).UTC()})
}

// writeJSONError answers {"error": msg}, as the API does.
func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// loginPage shows the login form, or sends a browser that has a session
// on to next. The old ?token= link is refused with a page that says what
// replaced it.
func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	next := localNext(q.Get("next"))
	if q.Has("token") {
		// The token may be right or wrong: it is not looked at, so this
		// answer tells a guesser nothing, and it is not logged.
		h.cfg.Log.Warn("dashboard login refused: the old /ui/login?token= link no longer logs in")
		h.render(w, r, http.StatusBadRequest, "login", page{Title: "Log in", Data: loginData{Next: next,
			Problem: "Links with ?token= no longer log in: they carried the API token. " + howToLogIn}})
		return
	}
	if _, err := h.sessionOf(r); err == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, "login", page{Title: "Log in", Data: loginData{Next: next}})
}

type loginData struct {
	Next string
	// Problem says why the last try failed.
	Problem string
}

// useLink logs in with a login link, once.
func (h *Handler) useLink(w http.ResponseWriter, r *http.Request) {
	next := localNext(r.URL.Query().Get("next"))
	if h.throttled(w, r, next) {
		return
	}
	err := h.store.spendLink(r.Context(), mux.Vars(r)["secret"], h.now())
	switch {
	case errors.Is(err, errUnknown):
		h.cfg.Throttle.Fail(r, "login link")
		h.refuseLogin(w, r, http.StatusUnauthorized, next, "dashboard login refused: login link unknown, spent or expired",
			"This login link has been used already, has expired (links last 10 minutes) or was never made. "+howToLogIn)
		return
	case err != nil:
		h.unavailable(w, r, err)
		return
	}
	h.logIn(w, r, next, "link")
}

// login checks the form's token. The form needs no CSRF token: a forged
// login would have to know the API token already.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	next := localNext(r.PostFormValue("next"))
	if h.throttled(w, r, next) {
		return
	}
	if !sameOrigin(r) || !h.keys.tokenOK(r.PostFormValue("token")) {
		h.cfg.Throttle.Fail(r, "login form")
		h.refuseLogin(w, r, http.StatusUnauthorized, next, "dashboard login refused: wrong token", "That token is not right.")
		return
	}
	h.logIn(w, r, next, "form")
}

// throttled answers 429 to a client with too many failed attempts.
func (h *Handler) throttled(w http.ResponseWriter, r *http.Request, next string) bool {
	wait := h.cfg.Throttle.Wait(r)
	if wait <= 0 {
		return false
	}
	throttle.RetryAfter(w, wait)
	h.render(w, r, http.StatusTooManyRequests, "login", page{Title: "Log in", Data: loginData{Next: next,
		Problem: fmt.Sprintf("Too many failed logins from your address: try again in %d seconds.", throttle.Seconds(wait))}})
	return true
}

// refuseLogin logs msg and shows the login form again, saying problem,
// with next kept for the next try.
func (h *Handler) refuseLogin(w http.ResponseWriter, r *http.Request, code int, next, msg, problem string) {
	h.cfg.Log.Warn(msg, zap.String("client", h.cfg.Throttle.Client(r)))
	h.render(w, r, code, "login", page{Title: "Log in", Data: loginData{Next: next, Problem: problem}})
}

// unavailable answers 503: the bucket of logins cannot be reached.
func (h *Handler) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	h.cfg.Log.Warn("dashboard login store unavailable", zap.Error(err))
	w.Header().Set("Retry-After", "5")
	h.errorPage(w, r, http.StatusServiceUnavailable,
		"Logins are unavailable for now: the gateway cannot reach NATS, where sessions are kept ("+err.Error()+"). Try again in a moment.")
}

// logIn starts a session, logs how the login came (via: link or form)
// and sends the browser on to next.
func (h *Handler) logIn(w http.ResponseWriter, r *http.Request, next, via string) {
	if err := h.startSession(w, r); err != nil {
		h.unavailable(w, r, err)
		return
	}
	h.cfg.Log.Info("dashboard login", zap.String("via", via), zap.String("client", h.cfg.Throttle.Client(r)))
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session on the server, then in the browser.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	secret, _ := r.Context().Value(sessionKey{}).(string)
	if err := h.store.endSession(r.Context(), secret); err != nil {
		// The cookie stays, so that the person can log out again: their
		// session is still good on the server.
		h.unavailable(w, r, err)
		return
	}
	h.clearSession(w, r)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}
