package tail

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLines(t *testing.T) {
	file := func(text string) string {
		p := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name   string
		path   string
		n      int
		window int64
		want   []string
	}{
		{"last two", file("one\ntwo\nthree\n"), 2, 1 << 10, []string{"two", "three"}},
		{"fewer than asked", file("only\n"), 5, 1 << 10, []string{"only"}},
		{"no final newline", file("a\nb"), 1, 1 << 10, []string{"b"}},
		{"window cuts a line", file("first line\nsecond\n"), 5, 9, []string{"e", "second"}},
		{"one line the size of the window", file(strings.Repeat("x", 16)), 1, 16, []string{strings.Repeat("x", 16)}},
		{"missing file", filepath.Join(t.TempDir(), "missing"), 3, 1 << 10, nil},
		{"no path", "", 3, 1 << 10, nil},
	} {
		if got := Lines(tc.path, tc.n, tc.window); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Lines = %q, want %q", tc.name, got, tc.want)
		}
	}
}
