package testkit

import (
	"net/http"
	"net/http/cgi"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// GitHTTPBackend serves the repositories under root over git's smart HTTP
// (git http-backend behind net/http/cgi), pushes included where a
// repository allows them (http.receivepack). Tests put their own checks,
// such as Basic auth, in front of it.
func GitHTTPBackend(t testing.TB, root string) http.Handler {
	t.Helper()
	exe, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	return &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(exe)), "git-http-backend"),
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
}
