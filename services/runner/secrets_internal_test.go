package runner

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/orch-dev/orch/kit/scrub"
	"github.com/orch-dev/orch/kit/service"
)

// A secret that a bound would cut in half is replaced whole before the
// cut, and the cut keeps the text valid UTF-8 within its bound.
func TestScrubbedCutsAfterScrubbing(t *testing.T) {
	const secret = "straddling-secret-0123456789"
	sc := scrub.Scrubber{Secrets: []string{secret}}
	for _, prefix := range []int{0, 900, 950, 990, 1000} {
		in := strings.Repeat("é", prefix/2) + secret + strings.Repeat("ü", 3000)
		got := scrubbed(sc, in, 1024, "text")
		if len(got) > 1024 || !utf8.ValidString(got) {
			t.Errorf("prefix %d: %d bytes, valid UTF-8 %v; want at most 1024, valid", prefix, len(got), utf8.ValidString(got))
		}
		if strings.Contains(got, secret[:8]) {
			t.Errorf("prefix %d: a piece of the secret is kept: %q", prefix, got[max(len(got)-200, 0):])
		}
		if !strings.HasSuffix(got, "the attempt's log has all of it]") {
			t.Errorf("prefix %d: no cut marker at the end: %q", prefix, got[max(len(got)-200, 0):])
		}
	}
	if got := scrubbed(sc, "short "+secret, 1024, "text"); got != "short [redacted]" {
		t.Errorf("short text: %q", got)
	}
}

// The runner's secrets include those of a Config built in Go, which the
// environment does not hold: here the NATS password and the NATS creds
// file's seed.
func TestSecretsOfConfig(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "runner.creds")
	const seed = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"
	if err := os.WriteFile(creds, []byte("-----BEGIN USER NKEY SEED-----\n"+seed+"\n------END USER NKEY SEED------\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const password = "nats-password-set-in-go"
	r := &Runner{cfg: Config{Common: service.Common{NATSCreds: creds, NATSPassword: password}}}
	if got := r.secrets(); !slices.Contains(got, seed) || !slices.Contains(got, password) {
		t.Errorf("secrets %q lack the creds file's seed or the NATS password", got)
	}
}
