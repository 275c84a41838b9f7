package webhook

import (
	"errors"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/testkit"
)

// The fixture was signed by a real Gitea with secret "fixture-secret".
func TestVerifyGiteaFixture(t *testing.T) {
	body, headers := testkit.Fixture(t, "../testdata", "gitea/pull_request__opened")
	sig := headers[GiteaSignature]
	tests := []struct {
		name, secret, sig string
		body              []byte
		ok                bool
	}{
		{"real signature", "fixture-secret", sig, body, true},
		{"X-Hub-Signature-256 form", "fixture-secret", headers["X-Hub-Signature-256"], body, true},
		{"upper-case hex", "fixture-secret", strings.ToUpper(sig), body, true},
		{"wrong secret", "other-secret", sig, body, false},
		{"empty signature (Gitea without a secret)", "fixture-secret", "", body, false},
		{"not hex", "fixture-secret", "zz" + sig[2:], body, false},
		{"truncated", "fixture-secret", sig[:32], body, false},
		{"body changed by one byte", "fixture-secret", sig, append([]byte(" "), body...), false},
		{"no secret configured", "", sig, body, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(tt.secret, tt.body, tt.sig)
			if tt.ok && err != nil {
				t.Errorf("Verify = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, ErrSignature) {
				t.Errorf("Verify = %v, want ErrSignature", err)
			}
		})
	}
}

func TestSignRoundTrip(t *testing.T) {
	body := []byte(`{"hello":"world"}`)
	if err := Verify("s3cret", body, Sign("s3cret", body)); err != nil {
		t.Fatal(err)
	}
}
