package api

import (
	"net/http"
	"strings"

	"github.com/orch-dev/orch/services/gateway/bearer"
)

// requireToken guards the private endpoints (every read that shows a job,
// and every write) with Authorization: Bearer <ORCH_API_TOKEN>, throttled
// per client by s.Throttle (see bearer.Require).
func (s *Server) requireToken(next http.Handler) http.Handler {
	return bearer.Require(s.APIToken, s.Throttle, next)
}

// loginLinkPath starts the path of a dashboard login link, whose last part
// is the link's secret.
const loginLinkPath = "/ui/login/"

// loggedPath is a request's path as the access log shows it: a login
// link's secret is left out, since until the link is used it logs a
// browser in.
func loggedPath(path string) string {
	if strings.HasPrefix(path, loginLinkPath) && len(path) > len(loginLinkPath) {
		return loginLinkPath + "[secret]"
	}
	return path
}
