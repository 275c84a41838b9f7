package egress_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/services/runner/egress"
)

// upstream is a stand-in for the Messages API: it answers POST
// /v1/messages as the API does (server-sent events when the request asks
// for stream, one JSON message otherwise) and keeps the headers each
// request arrived with. With ?gated=1 it writes the first event, then
// each next one only when the test sends on step.
type upstream struct {
	*httptest.Server
	step    chan struct{}
	release chan struct{}
	model   string
	status  int // answer with this status and an API error instead, when set
	// pause is slept between events, as the API takes its time between
	// them.
	pause time.Duration
	mu    sync.Mutex
	seen  []http.Header
	paths []string
}

func newStreamingUpstream(t *testing.T) *upstream {
	up := &upstream{step: make(chan struct{}), release: make(chan struct{}), model: "claude-sonnet-4-5-20250929"}
	up.Server = httptest.NewServer(http.HandlerFunc(up.serve))
	t.Cleanup(up.Close)
	return up
}

func (up *upstream) headers() []http.Header {
	up.mu.Lock()
	defer up.mu.Unlock()
	return slices.Clone(up.seen)
}

// events are the answer's server-sent events, as the API streams them.
func (up *upstream) events() []string {
	ev := func(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }
	return []string{
		ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"`+up.model+`","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1200,"cache_creation_input_tokens":300,"cache_read_input_tokens":500,"output_tokens":1}}}`),
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		ev("ping", `{"type":"ping"}`),
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`),
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}`),
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":60}}`),
		ev("message_stop", `{"type":"message_stop"}`),
	}
}

func (up *upstream) serve(w http.ResponseWriter, r *http.Request) {
	up.mu.Lock()
	up.seen = append(up.seen, r.Header.Clone())
	up.paths = append(up.paths, r.URL.RequestURI())
	up.mu.Unlock()
	var req struct {
		Stream bool `json:"stream"`
	}
	raw, _ := io.ReadAll(r.Body)
	json.Unmarshal(raw, &req)
	if up.status != 0 {
		w.Header().Set("retry-after", "30")
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(up.status)
		io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
		return
	}
	if !req.Stream {
		w.Header().Set("content-type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_2","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":2000,"cache_creation_input_tokens":0,"cache_read_input_tokens":1000,"output_tokens":100}}`, up.model)
		return
	}
	w.Header().Set("content-type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	gated := r.URL.Query().Get("gated") != ""
	for i, e := range up.events() {
		if gated && i > 0 {
			select {
			case <-up.step:
			case <-up.release:
				return
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, e)
		w.(http.Flusher).Flush()
		time.Sleep(up.pause)
	}
}

// postMessages sends a Messages API request to base (the proxy's /model
// or the upstream itself) with the placeholder key, as the agent would.
func postMessages(t *testing.T, base string, stream bool) *http.Response {
	t.Helper()
	u := base + "/v1/messages"
	if stream {
		u += "?gated=1"
	}
	body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":64,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", egress.PlaceholderAPIKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// readEvent reads one server-sent event (up to its blank line).
func readEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v (after %q)", err, b.String())
		}
		b.WriteString(line)
		if line == "\n" {
			return b.String()
		}
	}
}

func TestModelRequestCarriesTheRealKeyAndStreamsAsUpstreamFlushes(t *testing.T) {
	up := newStreamingUpstream(t)
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "sk-ant-real"})
	resp := postMessages(t, f.base+"/model", true)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %s", resp.Status)
	}
	// Each event must arrive before upstream writes the next one: the
	// upstream writes event i+1 only after the test has read event i.
	events := make(chan string)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(events)
		br := bufio.NewReader(resp.Body)
		for range up.events() {
			events <- readEvent(t, br)
		}
	}()
	for i, want := range up.events() {
		if i > 0 {
			up.step <- struct{}{}
		}
		select {
		case got := <-events:
			if got != want {
				t.Fatalf("event %d: got %q, want %q", i, got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("event %d did not come through while upstream waited: the proxy buffers", i)
		}
	}
	<-readDone
	h := up.headers()[0]
	if h.Get("X-Api-Key") != "sk-ant-real" || h.Get("Authorization") != "" {
		t.Fatalf("upstream got x-api-key %q, authorization %q", h.Get("X-Api-Key"), h.Get("Authorization"))
	}
	up.mu.Lock()
	path := up.paths[0]
	up.mu.Unlock()
	if path != "/v1/messages?gated=1" {
		t.Fatalf("upstream path %q", path)
	}
	for _, l := range f.log() {
		if strings.Contains(l, "sk-ant-real") {
			t.Fatalf("the key is in the job log: %q", l)
		}
	}
}

func TestModelRequestWithOAuthCarriesTheRealToken(t *testing.T) {
	up := newStreamingUpstream(t)
	f := setup(t, egress.Options{ModelUpstream: up.URL + "/", OAuthToken: "sk-ant-oat-real"})
	req, _ := http.NewRequest(http.MethodPost, f.base+"/model/v1/messages", strings.NewReader(`{"model":"claude-opus-4-5","stream":false}`))
	req.Header.Set("Authorization", "Bearer "+egress.PlaceholderOAuthToken)
	req.Header.Set("x-api-key", "agent-own")
	req.Header.Set("anthropic-beta", "claude-code-20250219, fine-grained-tool-streaming-2025-05-14")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h := up.headers()[0]
	if h.Get("Authorization") != "Bearer sk-ant-oat-real" || h.Get("X-Api-Key") != "" {
		t.Fatalf("upstream got authorization %q, x-api-key %q", h.Get("Authorization"), h.Get("X-Api-Key"))
	}
	if got := h.Get("Anthropic-Beta"); got != "claude-code-20250219,fine-grained-tool-streaming-2025-05-14,oauth-2025-04-20" {
		t.Fatalf("anthropic-beta %q", got)
	}
}

func TestAgentCredentialNeverLeavesWithoutARealOne(t *testing.T) {
	up := newStreamingUpstream(t)
	f := setup(t, egress.Options{ModelUpstream: up.URL})
	resp := postMessages(t, f.base+"/model", false)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if h := up.headers()[0]; h.Get("X-Api-Key") != "" || h.Get("Authorization") != "" {
		t.Fatalf("the agent's credential went upstream: %v", h)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestUsageIsMeteredFromStreamedAndWholeAnswers(t *testing.T) {
	up := newStreamingUpstream(t)
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "k"})
	resp := postMessages(t, f.base+"/model", true)
	go func() {
		for range len(up.events()) - 1 {
			up.step <- struct{}{}
		}
	}()
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp = postMessages(t, f.base+"/model", false)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	u := f.proxy.Usage()
	// Streamed: 1200 in, 300 cache writes, 500 cache reads, 60 out (the
	// message_delta's cumulative count replaces message_start's 1).
	// Whole: 2000 in, 1000 cache reads, 100 out.
	want := egress.Usage{Requests: 2, InputTokens: 3200, OutputTokens: 160, CacheCreationInputTokens: 300, CacheReadInputTokens: 1500}
	// Sonnet 4.5: $3 in, $3.75 5m cache write, $0.30 cache read, $15 out per million.
	wantCost := (3200*3 + 300*3.75 + 1500*0.30 + 160*15) / 1e6
	if u.Requests != want.Requests || u.InputTokens != want.InputTokens || u.OutputTokens != want.OutputTokens ||
		u.CacheCreationInputTokens != want.CacheCreationInputTokens || u.CacheReadInputTokens != want.CacheReadInputTokens ||
		!near(u.CostUSD, wantCost) || u.Unpriced != 0 {
		t.Fatalf("usage %+v, want %+v at $%.6f", u, want, wantCost)
	}
}

func TestUnknownModelIsCountedUnpriced(t *testing.T) {
	up := newStreamingUpstream(t)
	up.model = "claude-future-9"
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "k", Prices: map[string]egress.Price{"claude-sonnet-4-5": {Input: 1}}})
	resp := postMessages(t, f.base+"/model", false)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	u := f.proxy.Usage()
	if u.Unpriced != 1 || u.CostUSD != 0 || u.InputTokens != 2000 || !slices.Equal(u.UnpricedModels, []string{"claude-future-9"}) {
		t.Fatalf("usage %+v", u)
	}
}

func TestRateLimitIsRecordedWithItsRetryAfter(t *testing.T) {
	up := newStreamingUpstream(t)
	up.status = http.StatusTooManyRequests
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "k"})
	resp := postMessages(t, f.base+"/model", false)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" || !strings.Contains(string(b), "rate_limit_error") {
		t.Fatalf("answer %s %q", resp.Status, b)
	}
	u := f.proxy.Usage()
	if u.RateLimited != 1 || u.RetryAfter != 30*time.Second || u.RateLimitedAt.IsZero() {
		t.Fatalf("usage %+v", u)
	}
}

func TestAgentEnvHoldsOnlyPlaceholders(t *testing.T) {
	f := setup(t, egress.Options{APIKey: "sk-ant-real", OAuthToken: "sk-ant-oat-real", GitHosts: []string{"https://Gitea.example.com", "http://10.0.0.5:3000"}})
	env := f.proxy.AgentEnv("http://127.0.0.1:3128")
	want := []string{
		"HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
		"https_proxy=http://127.0.0.1:3128", "http_proxy=http://127.0.0.1:3128",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
		"ANTHROPIC_BASE_URL=http://127.0.0.1:3128/model",
		"ANTHROPIC_API_KEY=" + egress.PlaceholderAPIKey,
		"CLAUDE_CODE_OAUTH_TOKEN=" + egress.PlaceholderOAuthToken,
		"GIT_CONFIG_KEY_0=url.http://127.0.0.1:3128/git/http/10.0.0.5:3000/.insteadOf",
		"GIT_CONFIG_VALUE_0=http://10.0.0.5:3000/",
		"GIT_CONFIG_KEY_1=url.http://127.0.0.1:3128/git/https/gitea.example.com/.insteadOf",
		"GIT_CONFIG_VALUE_1=https://gitea.example.com/",
		"GIT_CONFIG_COUNT=2",
	}
	if !slices.Equal(env, want) {
		t.Fatalf("AgentEnv:\n got %q\nwant %q", env, want)
	}
}

// TestAnswerStartingBeforeTheBodyIsSentArrivesWhole has an upstream that
// answers while the request body is still coming, as HTTP allows: the
// proxy must go on sending the body after the answer's header went back.
func TestAnswerStartingBeforeTheBodyIsSentArrivesWhole(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("content-type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "data: read %d %v\n\n", n, err)
	}))
	defer up.Close()
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "k"})
	const size = 8 << 20
	resp, err := http.Post(f.base+"/model/v1/messages", "application/json", strings.NewReader(strings.Repeat("x", size)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("data: read %d <nil>\n\n", size); err != nil || string(b) != want {
		t.Fatalf("answer %q %v, want %q", b, err, want)
	}
}

// TestManyAnswersInARowAllArriveWhole sends streamed and whole requests
// one after another on one connection: the transport's last read of a
// request body can come after the answer started, which must not cut the
// answer.
func TestManyAnswersInARowAllArriveWhole(t *testing.T) {
	up := newStreamingUpstream(t)
	up.pause = time.Millisecond
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "k"})
	for i := range 300 {
		stream := i%2 == 1
		body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","stream":%v}`, stream)
		resp, err := http.Post(f.base+"/model/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d (stream %v): %s %v after %d bytes", i, stream, resp.Status, err, len(b))
		}
	}
	if u := f.proxy.Usage(); u.Requests != 300 || u.OutputTokens != 150*60+150*100 {
		t.Fatalf("usage %+v", u)
	}
}

// TestModelRequestSentThroughTheProxyToItself is a client that ignores
// NO_PROXY: it sends its request for ANTHROPIC_BASE_URL to the proxy as a
// proxy request, and the proxy serves it as the model API all the same.
func TestModelRequestSentThroughTheProxyToItself(t *testing.T) {
	up := newStreamingUpstream(t)
	f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "sk-ant-real"})
	f.proxy.AgentEnv(f.base)
	c := f.client(t, nil)
	req, _ := http.NewRequest(http.MethodPost, f.base+"/model/v1/messages", strings.NewReader(`{"stream":false}`))
	req.Header.Set("x-api-key", egress.PlaceholderAPIKey)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(up.headers()) != 1 || up.headers()[0].Get("X-Api-Key") != "sk-ant-real" {
		t.Fatalf("answer %s, upstream saw %v", resp.Status, up.headers())
	}
	if len(f.log()) != 0 || f.deny.Load() != 0 {
		t.Fatalf("refused: %q", f.log())
	}
}

// TestUsageIsReadWhateverTheKeyOrder streams events whose "type" comes
// last (as an encoder that sorts keys writes them), with and without
// "event:" lines.
func TestUsageIsReadWhateverTheKeyOrder(t *testing.T) {
	start := `{"message":{"model":"claude-haiku-4-5-20251001","usage":{"cache_creation":{"ephemeral_1h_input_tokens":400,"ephemeral_5m_input_tokens":100},"cache_creation_input_tokens":500,"input_tokens":10,"output_tokens":1}},"type":"message_start"}`
	delta := `{"delta":{"stop_reason":"end_turn"},"type":"message_delta","usage":{"output_tokens":20}}`
	for _, named := range []bool{true, false} {
		t.Run(fmt.Sprintf("event lines %v", named), func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("content-type", "text/event-stream")
				for _, ev := range []struct{ name, data string }{{"message_start", start}, {"ping", `{"type":"ping"}`}, {"message_delta", delta}} {
					if named {
						fmt.Fprintf(w, "event: %s\r\n", ev.name)
					}
					fmt.Fprintf(w, "data: %s\r\n\r\n", ev.data)
					w.(http.Flusher).Flush()
				}
			}))
			defer up.Close()
			f := setup(t, egress.Options{ModelUpstream: up.URL, APIKey: "k"})
			resp := postMessages(t, f.base+"/model", false)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			u := f.proxy.Usage()
			// Haiku 4.5: $1 in, $1.25 5m write, $2 1h write, $5 out per million.
			wantCost := (10*1 + 100*1.25 + 400*2 + 20*5) / 1e6
			if u.InputTokens != 10 || u.OutputTokens != 20 || u.CacheCreationInputTokens != 500 || !near(u.CostUSD, wantCost) {
				t.Fatalf("usage %+v, want cost %.6f", u, wantCost)
			}
		})
	}
}
