package freeport

import (
	"net"
	"strconv"
	"testing"
)

// The ports are distinct, below the ephemeral range, and free: a server
// binds each.
func TestLoopback(t *testing.T) {
	ports, err := Loopback(12)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p < lowest || p >= ephemeralLow() {
			t.Fatalf("ports %v: %d repeated or outside %d-%d", ports, p, lowest, ephemeralLow()-1)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d picked but not free: %v", p, err)
		}
		ln.Close()
	}
}
