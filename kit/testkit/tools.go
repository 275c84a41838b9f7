package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// Unavailable ends a test that needs a tool this machine lacks: it fails
// in CI (CI=true), which installs every such tool (.ci/run), and skips
// the test elsewhere, with msg saying how to install it.
func Unavailable(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RequireBwrap returns bubblewrap's path, or ends the test (Unavailable).
func RequireBwrap(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("bwrap")
	if err != nil {
		Unavailable(t, "bubblewrap (bwrap) is not on PATH: apt-get install bubblewrap")
	}
	return path
}
