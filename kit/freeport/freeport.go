// Package freeport picks loopback ports for servers that must know their
// ports before they start: a cluster's route ports, written into every
// member's configuration, and a server started again on its old port.
//
// A port a listener on port 0 was given, then closed, is one of the
// kernel's ephemeral ports: any process's next outgoing connection may
// take it before the server binds it ("address already in use", seen
// once in a make test loop beside a second copy). The ports picked here
// lie below the ephemeral range (net.ipv4.ip_local_port_range), where the
// kernel hands out nothing by itself; each was free when picked.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the least port picked: above the well-known and most
// registered service ports.
const lowest = 10000

// Loopback returns n distinct ports free on 127.0.0.1 a moment ago.
func Loopback(n int) ([]int, error) {
	top := ephemeralLow()
	var (
		ports []int
		lns   []net.Listener
	)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("no %d free loopback ports in %d-%d", n, lowest, top-1)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lowest+rand.IntN(top-lowest)))
		if err != nil {
			continue // taken
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= lowest+1000 {
		return 32768
	}
	return low
}
