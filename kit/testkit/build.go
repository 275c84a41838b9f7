package testkit

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"testing"
)

// Build compiles the main package pkg (an import path the calling test's
// module can build) into dir as `make build` does (static, no race
// detector) and returns the program's path, named after pkg's last
// element.
func Build(t testing.TB, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, path.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
