package egress_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/services/runner/egress"
)

// benchUpstream is the stand-in API of the benchmarks: a whole JSON answer
// to a plain request, and to ?stream=1 the headers, then (after stamping
// sent) the first event, flushed.
type benchUpstream struct {
	*httptest.Server
	sent atomic.Int64 // UnixNano just before the first event is written
}

func newBenchUpstream(b *testing.B) *benchUpstream {
	up := &benchUpstream{}
	const whole = `{"id":"msg","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":10,"output_tokens":2}}`
	start := "event: message_start\ndata: " + `{"type":"message_start","message":{"model":"claude-sonnet-4-5","usage":{"input_tokens":10,"output_tokens":1}}}` + "\n\n"
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("stream") == "" {
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, whole)
			return
		}
		w.Header().Set("content-type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		up.sent.Store(time.Now().UnixNano())
		io.WriteString(w, start)
		w.(http.Flusher).Flush()
		io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	b.Cleanup(up.Close)
	return up
}

// benchProxy serves a proxy in front of up.
func benchProxy(b *testing.B, up string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	p, err := egress.Serve(ln, egress.Options{ModelUpstream: up, APIKey: "k", Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	return "http://" + ln.Addr().String() + "/model"
}

const benchBody = `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`

// modelRoundTrip posts one request to base and reads the whole answer.
func modelRoundTrip(b *testing.B, c *http.Client, base string) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(benchBody))
	req.Header.Set("x-api-key", egress.PlaceholderAPIKey)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatal(resp.Status)
	}
}

// reportP50 adds the median of d as a metric.
func reportP50(b *testing.B, d []time.Duration, unit string) {
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), unit)
}

// BenchmarkModelRequest is one non-streamed model request, straight to
// the stand-in API and through the proxy; p50-µs is the median round trip.
func BenchmarkModelRequest(b *testing.B) {
	up := newBenchUpstream(b)
	for _, side := range []struct{ name, base string }{{"direct", up.URL}, {"proxy", benchProxy(b, up.URL)}} {
		b.Run(side.name, func(b *testing.B) {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			modelRoundTrip(b, c, side.base)
			d := make([]time.Duration, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				modelRoundTrip(b, c, side.base)
				d = append(d, time.Since(t0))
			}
			reportP50(b, d, "p50-µs")
		})
	}
}

// BenchmarkFirstStreamedByte is the delay from the stand-in API writing
// its first event to the client reading its first byte, straight and
// through the proxy; p50-µs is the median.
func BenchmarkFirstStreamedByte(b *testing.B) {
	up := newBenchUpstream(b)
	for _, side := range []struct{ name, base string }{{"direct", up.URL}, {"proxy", benchProxy(b, up.URL)}} {
		b.Run(side.name, func(b *testing.B) {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			d := make([]time.Duration, 0, b.N)
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, side.base+"/v1/messages?stream=1", strings.NewReader(benchBody))
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				br := bufio.NewReader(resp.Body)
				if _, err := br.ReadByte(); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Duration(time.Now().UnixNano()-up.sent.Load()))
				io.Copy(io.Discard, br)
				resp.Body.Close()
			}
			reportP50(b, d, "p50-µs")
		})
	}
}
