package egress

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"go.uber.org/zap"
)

// oauthBeta is the anthropic-beta flag the API wants beside an OAuth
// bearer token; Claude Code sends it when it logs in with
// CLAUDE_CODE_OAUTH_TOKEN.
const oauthBeta = "oauth-2025-04-20"

// modelAPI serves /model/...: it forwards to ModelUpstream plus the rest
// of the path with the agent's credential headers replaced by the
// runner's, streams the answer back as it comes (FlushInterval -1: every
// write is flushed at once) and meters its usage on the way.
func (p *Proxy) modelAPI(w http.ResponseWriter, r *http.Request) {
	p.meter.request()
	p.allowed(p.modelTarget(), "model")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, "/model")
			if pr.In.URL.RawPath != "" {
				pr.Out.URL.RawPath = strings.TrimPrefix(pr.In.URL.RawPath, "/model")
			}
			pr.SetURL(p.model)
			p.setCredential(pr.Out.Header)
			// The transport asks for gzip itself and unpacks it, so the
			// meter reads plain JSON.
			pr.Out.Header.Del("Accept-Encoding")
		},
		Transport:      p.upstream,
		FlushInterval:  -1,
		ErrorLog:       p.errLog,
		ModifyResponse: p.meterAnswer,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.Info("model API request failed", zap.String("path", r.URL.Path), zap.Error(err))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"type":"error","error":{"type":"api_error","message":%q}}`, "orch egress proxy: reaching the model API: "+err.Error())
		},
	}
	rp.ServeHTTP(w, r)
}

// setCredential drops whatever credential the agent sent and puts the
// runner's in its place: APIKey as x-api-key, else OAuthToken as a bearer
// token with the OAuth beta flag; with neither, the request goes without.
func (p *Proxy) setCredential(h http.Header) {
	h.Del("X-Api-Key")
	h.Del("Authorization")
	switch {
	case p.o.APIKey != "":
		h.Set("X-Api-Key", p.o.APIKey)
		setBeta(h, oauthBeta, false)
	case p.o.OAuthToken != "":
		h.Set("Authorization", "Bearer "+p.o.OAuthToken)
		setBeta(h, oauthBeta, true)
	}
}

// setBeta adds (on) or removes flag in the comma-separated anthropic-beta
// header, keeping the other flags.
func setBeta(h http.Header, flag string, on bool) {
	var flags []string
	found := false
	for _, v := range h.Values("Anthropic-Beta") {
		for f := range strings.SplitSeq(v, ",") {
			f = strings.TrimSpace(f)
			switch {
			case f == "":
			case f == flag:
				found = true
				if on {
					flags = append(flags, f)
				}
			default:
				flags = append(flags, f)
			}
		}
	}
	if on && !found {
		flags = append(flags, flag)
	}
	h.Del("Anthropic-Beta")
	if len(flags) > 0 {
		h.Set("Anthropic-Beta", strings.Join(flags, ","))
	}
}

// meterAnswer records a 429's retry-after and wraps a successful answer's
// body in the meter for its kind.
func (p *Proxy) meterAnswer(resp *http.Response) error {
	if resp.StatusCode == http.StatusTooManyRequests {
		now := time.Now()
		after := retryAfter(resp.Header.Get("Retry-After"), now)
		p.meter.rateLimited(after, now)
		p.log.Info("model API rate limited", zap.Duration("retry_after", after))
		return nil
	}
	if resp.StatusCode/100 != 2 {
		return nil
	}
	done := func(model string, t tokens) { p.meter.add(model, t, p.prices) }
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch ct {
	case "text/event-stream":
		resp.Body = &sseMeter{body: resp.Body, done: done}
	case "application/json":
		resp.Body = &jsonMeter{body: resp.Body, done: done}
	}
	return nil
}

// modelTarget is the model upstream's host:port, for the log.
func (p *Proxy) modelTarget() string {
	if p.model.Port() != "" {
		return p.model.Host
	}
	port := "443"
	if p.model.Scheme == "http" {
		port = "80"
	}
	return net.JoinHostPort(p.model.Hostname(), port)
}
