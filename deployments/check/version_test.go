package check

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionFlag builds each service as its Dockerfile does (its own
// module, GOWORK=off, CGO_ENABLED=0, the version stamped with -ldflags)
// and asks the binary for -version.
func TestVersionFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the three services")
	}
	bin := t.TempDir()
	for _, svc := range []string{"gateway", "runner", "notifier"} {
		t.Run(svc, func(t *testing.T) {
			out := filepath.Join(bin, svc)
			build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version=v0.0.0-check", "-o", out, "./cmd/"+svc)
			build.Dir = filepath.Join(repoRoot, "services", svc)
			build.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
			if msg, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build (GOWORK=off, as in the image): %v\n%s", err, msg)
			}
			got, err := exec.Command(out, "-version").CombinedOutput()
			if err != nil {
				t.Fatalf("%s -version: %v\n%s", svc, err, got)
			}
			if !strings.HasPrefix(string(got), svc+" v0.0.0-check ") {
				t.Errorf("%s -version = %q, want %q first", svc, got, svc+" v0.0.0-check")
			}
		})
	}
}
