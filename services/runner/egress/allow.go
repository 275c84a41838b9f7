package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// allowlist is the set of host:port targets (canonical, see canonTarget)
// tunnels and plain HTTP may reach.
type allowlist map[string]struct{}

// parseAllowlist reads host[:port] entries, port 443 when left out.
func parseAllowlist(entries []string) (allowlist, error) {
	a := allowlist{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		t, err := canonTarget(e, "443")
		if err != nil {
			return nil, fmt.Errorf("egress: allow entry %q: %w", e, err)
		}
		a[t] = struct{}{}
	}
	return a, nil
}

func (a allowlist) has(target string) bool {
	_, ok := a[target]
	return ok
}

// canonTarget parses host[:port] (an IPv6 literal in brackets) into the
// form the allowlist is keyed by: the host lowercased without a trailing
// dot, an IP literal in its canonical form, and the port, defPort when
// there is none. Anything else is an error: userinfo
// ("allowed.example.com@evil"), a path, an empty host, a bad port.
func canonTarget(hostport, defPort string) (string, error) {
	host, port := hostport, defPort
	h, pt, splitErr := net.SplitHostPort(hostport)
	switch {
	case splitErr == nil:
		host, port = h, pt
	case strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]"):
		host = hostport[1 : len(hostport)-1]
	case strings.Count(hostport, ":") > 1:
		// A bare IPv6 literal, no port.
	case strings.Contains(hostport, ":"):
		return "", splitErr
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return "", fmt.Errorf("bad port %q", port)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", errors.New("an IPv6 zone is not allowed")
		}
		return net.JoinHostPort(a.Unmap().String(), port), nil
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if !validHostname(host) {
		return "", fmt.Errorf("%q is not a host name or IP address", host)
	}
	return net.JoinHostPort(host, port), nil
}

// validHostname accepts DNS names: letters, digits, '-' and '_' in dot
// separated labels of 1 to 63 characters.
func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// denyError is a dial the allowlist refused: the target and why.
type denyError struct{ target, reason string }

func (e *denyError) Error() string { return e.target + " is not allowed: " + e.reason }

// internal says whether an address is one of the host's own or a
// link's: loopback (where the runner's host services listen), link-local
// (cloud metadata), unspecified or multicast. A name in the allowlist that
// resolves to one is refused unless that address is itself allowed, so a
// name's DNS cannot turn an allowed host into the host's own ports.
// Private ranges are not internal: an allowed internal mirror is normal.
func internal(a netip.Addr) bool {
	return a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsUnspecified() || a.IsMulticast() || a.IsInterfaceLocalMulticast()
}

// dialAllowed connects to target if the allowlist names it: an IP
// literal only when listed as such; a name is resolved here and its
// internal addresses are refused unless listed. It is the only way a
// tunnel or a plain HTTP request leaves.
func (p *Proxy) dialAllowed(ctx context.Context, _, addr string) (net.Conn, error) {
	target, err := canonTarget(addr, "443")
	if err != nil {
		return nil, &denyError{quoteTarget(addr), err.Error()}
	}
	if !p.allow.has(target) {
		return nil, &denyError{target, "not in the allowlist"}
	}
	host, port, _ := net.SplitHostPort(target)
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", host, err)
		}
		var refused []string
		for _, a := range ips {
			a = a.Unmap()
			if internal(a) && !p.allow.has(net.JoinHostPort(a.String(), port)) {
				refused = append(refused, a.String())
				continue
			}
			addrs = append(addrs, a)
		}
		if len(addrs) == 0 {
			return nil, &denyError{target, "it resolves to " + strings.Join(refused, ", ") + ", an address of this host or its link; list the address itself to allow it"}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, p.o.DialTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 30 * time.Second}
	var firstErr error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, firstErr
}
