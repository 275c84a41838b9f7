// Package bearer is the check of ORCH_API_TOKEN that guards what shows or
// changes a job: the queue API (package api) and the dashboard's POST
// /ui/login-links (package ui), which makes login links. One check, so
// both faces refuse alike and share the throttle of wrong tokens.
package bearer

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/orch-dev/orch/services/gateway/throttle"
)

// Require guards next with Authorization: Bearer <token>. Without the
// right token the answer is 401 and carries no job content, also for an id
// that does not exist, so a caller cannot probe for jobs. With no token
// configured the endpoints are off: 403, saying how to turn them on,
// rather than open to anyone who can reach the webhooks.
//
// A request that carries a wrong Authorization header counts as a failed
// attempt of its client (one without the header guesses nothing); a
// client with too many of them is answered 429 with Retry-After before its
// token is looked at (see package throttle). Refusals are the queue API's
// JSON error, {"error": "..."}.
func Require(token string, limit *throttle.Limiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			writeError(w, http.StatusForbidden, "the queue and job endpoints are disabled: ORCH_API_TOKEN is not set")
			return
		}
		if wait := limit.Wait(r); wait > 0 {
			throttle.RetryAfter(w, wait)
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf(
				"too many wrong tokens from this address: try again in %d s", throttle.Seconds(wait)))
			return
		}
		if !tokenOK(r, token) {
			if r.Header.Get("Authorization") != "" {
				limit.Fail(r, "bearer token")
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="orch"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token: send Authorization: Bearer $ORCH_API_TOKEN")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tokenOK reports whether r carries token as its bearer token, compared
// in constant time.
func tokenOK(r *http.Request, token string) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}

// writeError answers {"error": msg}, the shape of every API error.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}
