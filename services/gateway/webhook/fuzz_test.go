package webhook

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// seeds returns every fixture body of a sender with its event header.
func seeds(tb testing.TB, sender, header string) [][2]string {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("..", "testdata", sender, "*.headers.json"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no fixtures for %s: %v", sender, err)
	}
	var out [][2]string
	for _, hf := range files {
		raw, err := os.ReadFile(hf)
		if err != nil {
			tb.Fatal(err)
		}
		var h map[string]string
		if err := json.Unmarshal(raw, &h); err != nil {
			tb.Fatal(err)
		}
		body, err := os.ReadFile(strings.TrimSuffix(hf, ".headers.json") + ".json")
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, [2]string{h[header], string(body)})
	}
	return out
}

// Any body either parses or fails with ErrMalformed; it never panics.
func FuzzParseGitea(f *testing.F) {
	for _, s := range seeds(f, "gitea", GiteaEventType) {
		f.Add(s[0], []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		ev, err := ParseGitea(event, body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if ev.Type != event {
			t.Fatalf("type %q, want %q", ev.Type, event)
		}
	})
}

func FuzzParsePlane(f *testing.F) {
	for _, s := range seeds(f, "plane", PlaneEventHeader) {
		f.Add(s[0], []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		ev, err := ParsePlane(header, body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if ev.Issue != nil && ev.Issue.ID == "" || ev.Comment != nil && ev.Comment.ID == "" {
			t.Fatalf("parsed an item without id: %+v", ev)
		}
		_ = Values(ev.Activity.NewValue)
	})
}

// Only the signature of the body under the secret verifies.
func FuzzVerify(f *testing.F) {
	for _, s := range seeds(f, "gitea", GiteaSignature) {
		f.Add("fixture-secret", []byte("body"), s[0])
	}
	f.Add("s", []byte(""), "")
	f.Add("s", []byte("x"), "sha256=zz")
	f.Fuzz(func(t *testing.T, secret string, body []byte, sig string) {
		err := Verify(secret, body, sig)
		if err != nil && !errors.Is(err, ErrSignature) {
			t.Fatalf("error %v is not ErrSignature", err)
		}
		if secret != "" && Verify(secret, body, Sign(secret, body)) != nil {
			t.Fatal("a correct signature did not verify")
		}
		if err == nil && (secret == "" || !strings.EqualFold(strings.TrimPrefix(strings.TrimSpace(sig), "sha256="), Sign(secret, body))) {
			t.Fatalf("signature %q verified for a body it does not sign", sig)
		}
	})
}
