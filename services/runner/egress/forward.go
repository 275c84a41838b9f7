package egress

import (
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"

	"go.uber.org/zap"
)

// forward serves an absolute-URI request (GET http://host/path), the
// plain HTTP proxy: to an allowed host:port (port 80 when the URL has
// none), with any userinfo in the URL dropped and the Host header set from
// the URL, so the request reaches the host the allowlist was asked about.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	if r.URL.Scheme != "http" {
		p.refuse(w, http.StatusForbidden, quoteTarget(r.URL.Scheme+"://"+r.URL.Host),
			"only http:// URLs are forwarded; https goes through CONNECT")
		return
	}
	target, err := canonTarget(r.URL.Host, "80")
	if err != nil {
		p.refuse(w, http.StatusBadRequest, quoteTarget(r.URL.Host), err.Error())
		return
	}
	if !p.allow.has(target) {
		p.refuse(w, http.StatusForbidden, target, "not in the allowlist")
		return
	}
	if r.Header.Get("Upgrade") != "" {
		p.refuse(w, http.StatusForbidden, target, "a protocol upgrade through the plain HTTP proxy; use CONNECT")
		return
	}
	p.allowed(target, "http")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := *pr.In.URL
			u.User = nil
			u.Host = hostHeader(target, "80")
			pr.Out.URL = &u
			pr.Out.Host = ""
		},
		Transport:     p.direct,
		FlushInterval: -1,
		ErrorLog:      p.errLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if de := (*denyError)(nil); errors.As(err, &de) {
				p.refuse(w, http.StatusForbidden, de.target, de.reason)
				return
			}
			p.log.Info("egress http: forwarding failed", zap.String("target", target), zap.Error(err))
			http.Error(w, "orch egress proxy: "+target+": "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// hostHeader is target as a Host header: without the port when it is the
// scheme's default.
func hostHeader(target, defPort string) string {
	host, port, _ := net.SplitHostPort(target)
	if port == defPort {
		if strings.Contains(host, ":") {
			return "[" + host + "]"
		}
		return host
	}
	return target
}
