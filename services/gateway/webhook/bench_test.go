package webhook

import (
	"os"
	"testing"
)

// BenchmarkParseGiteaPR reads the 12 KB pull request body, the bulk of a
// webhook's CPU in the gateway (docs/performance.md, intake).
func BenchmarkParseGiteaPR(b *testing.B) {
	body, err := os.ReadFile("../testdata/gitea/pull_request__opened.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseGitea("pull_request", body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify checks the signature of the same body.
func BenchmarkVerify(b *testing.B) {
	body, err := os.ReadFile("../testdata/gitea/pull_request__opened.json")
	if err != nil {
		b.Fatal(err)
	}
	sig := Sign("s", body)
	b.ReportAllocs()
	for b.Loop() {
		if err := Verify("s", body, sig); err != nil {
			b.Fatal(err)
		}
	}
}
