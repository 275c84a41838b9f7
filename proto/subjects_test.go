package proto

import (
	"strings"
	"testing"
)

// Token's result is safe in a subject, a key, a file name and a branch,
// and Token of a token is the token itself (Job.Validate relies on it).
func TestToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"acme-api", "acme-api"},
		{"WID-41", "wid-41"},
		{"feature/fix emoji", "feature-fix-emoji"},
		{"--x--", "x"},
		{"", "_"},
		{"..", "_"},
		{strings.Repeat("a", 70), strings.Repeat("a", 64)},
		// A cut at 64 that ends on a dash drops the dash.
		{strings.Repeat("a", 63) + "/bcd", strings.Repeat("a", 63)},
		{"6a52-3d1b-4c7e-" + strings.Repeat("R", 32) + "b20d1c-4960-41ca-4", "6a52-3d1b-4c7e-" + strings.Repeat("r", 32) + "b20d1c-4960-41ca"},
	} {
		got := Token(tc.in)
		if got != tc.want {
			t.Errorf("Token(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if again := Token(got); again != got {
			t.Errorf("Token(%q) = %q, not a token (Token of it is %q)", tc.in, got, again)
		}
	}
}
