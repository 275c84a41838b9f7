package natscluster

import (
	"errors"
	"io"
	"net"
	"sync"
)

// proxy forwards every TCP connection it accepts to one address, and can
// be cut: its connections are closed and new ones are refused (accepted
// and closed at once) until it is healed. One proxy carries the routes one
// server dials to another, so cutting every proxy to and from a server
// partitions it from the cluster while its clients still reach it.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and every connection's copies
}

// newProxy listens on a free loopback port and forwards to target.
func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// addr is where the proxy listens.
func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// forward copies c to and from a new connection to the target until
// either side closes or the proxy is cut.
func (p *proxy) forward(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(c, up) {
		return
	}
	defer p.untrack(c, up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Either direction ending ends both: a route is one conversation.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(up, c) // both end before forward returns: it waits for both
	go pipe(c, up)
	<-done
	<-done
}

// track registers a connection pair, unless the proxy was cut meanwhile.
func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// setCut cuts the proxy (every connection closed, new ones refused) or
// heals it.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if !cut {
		return
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// close stops the proxy and waits for its goroutines.
func (p *proxy) close() error {
	err := p.ln.Close()
	p.setCut(true)
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
