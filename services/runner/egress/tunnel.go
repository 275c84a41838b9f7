package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// tunnel serves CONNECT host:port: it dials the target if the allowlist
// names it, answers 200 and copies bytes both ways until either side
// closes, the tunnel sits idle for IdleTimeout, or the proxy closes.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request) {
	target, err := canonTarget(r.Host, "443")
	if err != nil {
		p.refuse(w, http.StatusBadRequest, quoteTarget(r.Host), err.Error())
		return
	}
	if !p.allow.has(target) {
		p.refuse(w, http.StatusForbidden, target, "not in the allowlist")
		return
	}
	select {
	case p.tunnelSlots <- struct{}{}:
		defer func() { <-p.tunnelSlots }()
	default:
		p.log.Warn("egress tunnel refused: too many open", zap.String("target", target), zap.Int("max", p.o.MaxTunnels))
		p.jobLog(fmt.Sprintf("orch: egress busy %s: %d tunnels open already", target, p.o.MaxTunnels))
		http.Error(w, fmt.Sprintf("orch egress proxy: %d tunnels open already, the most one job may hold", p.o.MaxTunnels), http.StatusServiceUnavailable)
		return
	}
	up, err := p.dialAllowed(r.Context(), "tcp", target)
	if err != nil {
		if de := (*denyError)(nil); errors.As(err, &de) {
			p.refuse(w, http.StatusForbidden, de.target, de.reason)
			return
		}
		p.log.Info("egress tunnel: connecting failed", zap.String("target", target), zap.Error(err))
		http.Error(w, fmt.Sprintf("orch egress proxy: connecting to %s: %v", target, err), http.StatusBadGateway)
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "orch egress proxy: cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	p.allowed(target, "tunnel")
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	// A client may send its first bytes (a TLS hello) right behind the
	// CONNECT line; they sit in the server's read buffer.
	if n := brw.Reader.Buffered(); n > 0 {
		head, _ := brw.Reader.Peek(n)
		if _, err := up.Write(head); err != nil {
			return
		}
	}
	p.pipe(client, up)
}

// pipe copies a to b and b to a, each write as soon as its read returns,
// until both directions ended or the pair sat idle (no byte either way)
// for IdleTimeout. An end of stream half-closes the other side so a
// request-then-response protocol finishes; an error closes both.
func (p *Proxy) pipe(a, b net.Conn) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	wg.Go(func() { p.copyIdle(b, a, &last) })
	p.copyIdle(a, b, &last)
	wg.Wait()
}

// copyIdle copies src to dst until src ends (then dst's write side is
// closed) or fails or the pair is idle (then both are closed).
func (p *Proxy) copyIdle(dst, src net.Conn, last *atomic.Int64) {
	idle := p.o.IdleTimeout
	buf := make([]byte, 32<<10)
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			dst.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				dst.Close()
				return
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, last.Load())) < idle:
			// The other direction is busy: the pair is not idle.
		case errors.Is(err, io.EOF):
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			} else {
				dst.Close()
			}
			return
		default:
			src.Close()
			dst.Close()
			return
		}
	}
}
