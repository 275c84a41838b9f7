package initproc

import "testing"

// TestSpecRoundTrip: what the runner puts in InitEnv, init reads back as
// it was, a socket path with spaces included; anything else is refused.
func TestSpecRoundTrip(t *testing.T) {
	t.Parallel()
	for _, s := range []Spec{
		{},
		{Port: 3128, Socket: "/run/orch/egress.sock"},
		{Port: 3128, Socket: "/a dir/with spaces.sock", Limits: Limits{MemoryMax: 512 << 20, PidsMax: 1000}},
		{Limits: Limits{MemoryMax: 1}},
	} {
		got, err := ParseSpec(s.String())
		if err != nil || got != s {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", s.String(), got, err, s)
		}
	}
	for _, bad := range []string{"", "3128", "3128 0 0", "x 0 0 /s", "3128 0 y /s", `{"port":3128}`} {
		if s, err := ParseSpec(bad); err == nil {
			t.Errorf("ParseSpec(%q) = %+v, want an error", bad, s)
		}
	}
}
