package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/bench/internal/fakeanthropic"
	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/services/runner/egress"
)

// egressRequests is how many model requests each side of the egress rows
// sends.
const egressRequests = 500

// egressRows measures what the runner's egress proxy adds to a model
// request: the stand-in API (bench/internal/fakeanthropic) served on
// loopback, asked straight and through the proxy on its unix socket as a
// confined agent reaches it, one request at a time, alternating sides so
// that both see the same machine.
func (b *bench) egressRows(ctx context.Context, t *table) error {
	progress("model requests straight to the stand-in API and through the egress proxy, %d each", egressRequests)
	up := &stampedAPI{h: &fakeanthropic.Server{Default: "text"}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: up}
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ln) })
	defer func() { srv.Close(); wg.Wait() }()
	apiURL := "http://" + ln.Addr().String()

	sock := filepath.Join(b.dir, "egress.sock")
	p, err := egress.Listen(sock, egress.Options{Project: "bench", ModelUpstream: apiURL, APIKey: "bench-key"})
	if err != nil {
		return err
	}
	defer p.Close()
	viaSocket := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	defer viaSocket.CloseIdleConnections()
	straight := &http.Transport{}
	defer straight.CloseIdleConnections()
	sides := []struct {
		c    *http.Client
		base string
	}{
		{&http.Client{Transport: straight}, apiURL},
		{&http.Client{Transport: viaSocket}, "http://127.0.0.1/model"},
	}

	var whole, first [2]stats.Sample
	for i := range egressRequests + 10 {
		for s, side := range sides {
			d, err := modelRequest(ctx, side.c, side.base, false, up)
			if err != nil {
				return err
			}
			f, err := modelRequest(ctx, side.c, side.base, true, up)
			if err != nil {
				return err
			}
			if i >= 10 { // the first requests warm the connections up
				whole[s] = append(whole[s], d)
				first[s] = append(first[s], f)
			}
		}
	}
	if u := p.Usage(); u.Requests < 2*egressRequests {
		return fmt.Errorf("egress proxy metered %d requests, want %d", u.Requests, 2*egressRequests)
	}
	added := whole[1].P50() - whole[0].P50()
	t.add(row{what: "model request p50 through the egress proxy", orch: stats.Ms(whole[1].P50()),
		base: "straight to stand-in API " + stats.Ms(whole[0].P50()), ratio: deltaMs(added),
		target: "<= +2 ms", verdict: verdict(added <= 2*time.Millisecond)})
	t.add(row{what: "model request p99 through the egress proxy", orch: stats.Ms(whole[1].P99()),
		base: "straight " + stats.Ms(whole[0].P99()), ratio: deltaMs(whole[1].P99() - whole[0].P99()), target: "-", verdict: "-"})
	t.add(row{what: "first streamed byte p50: API sent -> client read", orch: stats.Ms(first[1].P50()),
		base: "straight " + stats.Ms(first[0].P50()), ratio: deltaMs(first[1].P50() - first[0].P50()),
		target: "<= 5 ms", verdict: verdict(first[1].P50() <= 5*time.Millisecond)})
	t.add(row{what: "first streamed byte p99", orch: stats.Ms(first[1].P99()),
		base: "straight " + stats.Ms(first[0].P99()), ratio: deltaMs(first[1].P99() - first[0].P99()), target: "-", verdict: "-"})
	return nil
}

// modelRequest sends one Messages API request as Claude Code does and
// reads the answer: for a whole answer it returns the round trip, for a
// stream the delay from the API writing its first event to the client
// reading its first byte.
func modelRequest(ctx context.Context, c *http.Client, base string, stream bool, up *stampedAPI) (time.Duration, error) {
	body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":64,"stream":%v,"messages":[{"role":"user","content":"fake:text"}]}`, stream)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", egress.PlaceholderAPIKey)
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadByte(); err != nil {
		return 0, fmt.Errorf("model request to %s (stream %v): %w", base, stream, err)
	}
	firstAt := time.Now()
	if _, err := io.Copy(io.Discard, br); err != nil {
		return 0, fmt.Errorf("model request to %s (stream %v): %w", base, stream, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("model request to %s: %s", base, resp.Status)
	}
	if stream {
		return firstAt.Sub(up.firstWrite()), nil
	}
	return time.Since(t0), nil
}

// stampedAPI serves the stand-in API and notes when each answer's first
// byte was written (requests are one at a time).
type stampedAPI struct {
	h     http.Handler
	mu    sync.Mutex
	first time.Time
}

func (s *stampedAPI) firstWrite() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

func (s *stampedAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.h.ServeHTTP(&stampWriter{ResponseWriter: w, api: s}, r)
}

// stampWriter stamps the first Write of an answer.
type stampWriter struct {
	http.ResponseWriter
	api     *stampedAPI
	stamped bool
}

func (w *stampWriter) Write(b []byte) (int, error) {
	if !w.stamped {
		w.stamped = true
		w.api.mu.Lock()
		w.api.first = time.Now()
		w.api.mu.Unlock()
	}
	return w.ResponseWriter.Write(b)
}

func (w *stampWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }
