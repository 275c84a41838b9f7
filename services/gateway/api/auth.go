package api

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// requireToken guards the private endpoints (every read that shows a job,
// and every write) with Authorization: Bearer <ORCH_API_TOKEN>. Without
// the right token the answer is 401 and carries no job content, also for
// an id that does not exist, so a caller cannot probe for jobs. With no
// token configured the private endpoints are off: 403, saying how to turn
// them on, rather than open to anyone who can reach the webhooks.
func (s *Server) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.APIToken == "" {
			writeError(w, http.StatusForbidden, "the queue and job endpoints are disabled: ORCH_API_TOKEN is not set")
			return
		}
		if !s.tokenOK(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="orch"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token: send Authorization: Bearer $ORCH_API_TOKEN")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tokenOK reports whether r carries the configured bearer token, compared
// in constant time.
func (s *Server) tokenOK(r *http.Request) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(s.APIToken)) == 1
}
