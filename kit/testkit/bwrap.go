package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// RequireBwrap returns bubblewrap's path. It skips the test on a machine
// without bwrap, and fails it in CI, which always installs it (.ci/run).
func RequireBwrap(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("bwrap")
	if err != nil {
		msg := "bubblewrap (bwrap) is not on PATH: apt-get install bubblewrap"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}
