package api

import "testing"

func TestTheAccessLogLeavesOutALoginLinksSecret(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		"/ui/login/Zr1abc": "/ui/login/[secret]",
		"/ui/login/":       "/ui/login/",
		"/ui/login":        "/ui/login",
		"/ui/login-links":  "/ui/login-links",
		"/jobs/abc/log":    "/jobs/abc/log",
		"/ui/jobs/login/x": "/ui/jobs/login/x",
	} {
		if got := loggedPath(path); got != want {
			t.Errorf("loggedPath(%q) = %q, want %q", path, got, want)
		}
	}
}
