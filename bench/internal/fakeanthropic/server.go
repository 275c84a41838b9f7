// Package fakeanthropic is a stand-in for the Anthropic Messages API that
// plays short scripted conversations, so that the real Claude Code CLI can
// be run against it on a developer's machine (ANTHROPIC_BASE_URL) without
// an account and without the network. It is a development tool: orch's
// tests use recorded transcripts instead of the CLI.
//
// A conversation picks its script with a word "fake:<script>" anywhere in
// what the CLI sends (the task text the runner writes is enough); without
// one the server's default script plays. The scripts:
//
//	commit   a Bash call that writes AGENT_WAS_HERE.md and commits it, then a final text
//	push     the same commit, then a push of the branch to origin, then a final text
//	read     a read-only Bash call (git log), then a final text naming its output
//	text     a final text at once, no tool call
//	500      every call answers HTTP 500 api_error
//	429      every call answers HTTP 429 rate_limit_error with retry-after: 1
//	529      every call answers HTTP 529 overloaded_error
//	hang     every call waits until the client gives up
//
// Answers are streamed as the real API streams them (message_start,
// content_block_start, ping, content_block_delta, content_block_stop,
// message_delta, message_stop) when the request asks for stream: true, and
// are one JSON message otherwise.
package fakeanthropic

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scripts names the conversations the server can play.
var Scripts = []string{"commit", "push", "read", "text", "500", "429", "529", "hang"}

// CommitCommand is the Bash command of the commit script.
const CommitCommand = `printf '# Agent was here\n' > AGENT_WAS_HERE.md && git add AGENT_WAS_HERE.md && git commit -q -m 'Add AGENT_WAS_HERE.md' && git log --oneline -1`

// PushCommand is the Bash command of the push script: the commit, then a
// push of the branch checked out to origin, under its own name.
const PushCommand = CommitCommand + ` && git push -q origin HEAD && echo pushed`

// ReadCommand is the Bash command of the read script: one a review may run.
const ReadCommand = "git log --oneline -1"

// Call is what the server saw of one request, for its log.
type Call struct {
	N      int64
	Path   string
	Model  string
	Stream bool
	Tools  int
	// Messages counts the conversation's messages in the request: a
	// resumed session's first request carries its earlier turns.
	Messages int
	Script   string
	Answer   string
}

// Server is the stand-in; it is an http.Handler.
type Server struct {
	// Default is the script played when a request names none.
	Default string
	// Log, when set, is called once per request, after the answer.
	Log func(Call)

	n   atomic.Int64
	mu  sync.Mutex
	ids int
}

var _ http.Handler = (*Server)(nil)

var scriptWord = regexp.MustCompile(`fake:([a-z0-9]+)`)

// request is the part of a Messages API request the scripts read.
type request struct {
	Model    string            `json:"model"`
	Stream   bool              `json:"stream"`
	Tools    []json.RawMessage `json:"tools"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// block is one content block of an answer.
type block struct {
	Type  string         `json:"type"`
	Text  string         `json:"text,omitempty"`
	ID    string         `json:"id,omitempty"`
	Name  string         `json:"name,omitempty"`
	Input map[string]any `json:"input,omitempty"`
}

// toolResult is a tool_result block the CLI sends back.
type toolResult struct {
	Type      string          `json:"type"`
	ToolUseID string          `json:"tool_use_id"`
	IsError   bool            `json:"is_error"`
	Content   json.RawMessage `json:"content"`
}

// ServeHTTP answers POST /v1/messages by the conversation's script and
// anything else with the API's 404 error.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	call := Call{N: s.n.Add(1), Path: r.Method + " " + r.URL.Path}
	defer func() {
		if s.Log != nil {
			s.Log(call)
		}
	}()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		call.Answer = "404"
		apiError(w, http.StatusNotFound, "not_found_error", "Not found: "+r.URL.Path)
		return
	}
	raw, err := io.ReadAll(r.Body)
	var req request
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil {
		call.Answer = "400"
		apiError(w, http.StatusBadRequest, "invalid_request_error", "bad request body")
		return
	}
	call.Model, call.Stream, call.Tools, call.Messages = req.Model, req.Stream, len(req.Tools), len(req.Messages)
	call.Script = s.Default
	if m := scriptWord.FindSubmatch(raw); m != nil {
		call.Script = string(m[1])
	}
	switch call.Script {
	case "500":
		call.Answer = "500"
		apiError(w, http.StatusInternalServerError, "api_error", "Internal server error")
		return
	case "529":
		call.Answer = "529"
		apiError(w, 529, "overloaded_error", "Overloaded")
		return
	case "429":
		call.Answer = "429"
		w.Header().Set("retry-after", "1")
		apiError(w, http.StatusTooManyRequests, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")
		return
	case "hang":
		call.Answer = "hang"
		<-r.Context().Done()
		return
	}
	blocks, stop := s.turn(call.Script, &req)
	call.Answer = stop
	if req.Stream {
		s.stream(w, req.Model, blocks, stop)
		return
	}
	w.Header().Set("content-type", "application/json")
	w.Header().Set("request-id", s.id("req"))
	json.NewEncoder(w).Encode(map[string]any{
		"id": s.id("msg"), "type": "message", "role": "assistant", "model": req.Model,
		"content": blocks, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": 1200, "output_tokens": 60},
	})
}

// turn is the script's answer to the conversation so far: the first turn
// of a request with tools calls the script's tool; the turn after the tool
// result ends with a text. A request without tools (the CLI's side
// questions, such as a title for the session) gets a short text.
func (s *Server) turn(script string, req *request) ([]block, string) {
	cmd := map[string]string{"commit": CommitCommand, "push": PushCommand, "read": ReadCommand}[script]
	if res := lastToolResult(req); res != nil {
		out := resultText(res.Content)
		if res.IsError {
			return []block{{Type: "text", Text: "Could not run the command: " + out}}, "end_turn"
		}
		switch script {
		case "commit":
			return []block{{Type: "text", Text: "Done: added AGENT_WAS_HERE.md"}}, "end_turn"
		case "push":
			return []block{{Type: "text", Text: "Done: added AGENT_WAS_HERE.md and pushed it"}}, "end_turn"
		}
		return []block{{Type: "text", Text: "The last commit is " + out}}, "end_turn"
	}
	if len(req.Tools) == 0 || cmd == "" {
		return []block{{Type: "text", Text: "Nothing to do here."}}, "end_turn"
	}
	return []block{
		{Type: "text", Text: "I will run: " + cmd},
		{Type: "tool_use", ID: s.id("toolu_fake"), Name: "Bash", Input: map[string]any{"command": cmd, "description": "scripted by fakeanthropic"}},
	}, "tool_use"
}

// lastToolResult returns the tool result of the last user message, if it
// carries one.
func lastToolResult(req *request) *toolResult {
	if len(req.Messages) == 0 {
		return nil
	}
	m := req.Messages[len(req.Messages)-1]
	var blocks []toolResult
	if m.Role != "user" || json.Unmarshal(m.Content, &blocks) != nil {
		return nil
	}
	for i := range blocks {
		if blocks[i].Type == "tool_result" {
			return &blocks[i]
		}
	}
	return nil
}

// resultText is a tool result's content, a string or text blocks.
func resultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return strings.TrimSpace(s)
	}
	var parts []struct {
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return strings.TrimSpace(b.String())
}

// stream writes blocks as the API's server-sent events: text in two
// deltas, a tool call's input as partial JSON in two deltas.
func (s *Server) stream(w http.ResponseWriter, model string, blocks []block, stop string) {
	w.Header().Set("content-type", "text/event-stream")
	w.Header().Set("cache-control", "no-cache")
	w.Header().Set("request-id", s.id("req"))
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	event := func(name string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		flush()
	}
	event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": s.id("msg"), "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": 1200, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
	}})
	for i, b := range blocks {
		start, deltas := b, []map[string]any{}
		switch b.Type {
		case "text":
			start.Text = ""
			half := len(b.Text) / 2
			for _, part := range []string{b.Text[:half], b.Text[half:]} {
				deltas = append(deltas, map[string]any{"type": "text_delta", "text": part})
			}
		case "tool_use":
			start.Input = map[string]any{}
			in, _ := json.Marshal(b.Input)
			half := len(in) / 2
			for _, part := range []string{string(in[:half]), string(in[half:])} {
				deltas = append(deltas, map[string]any{"type": "input_json_delta", "partial_json": part})
			}
		}
		startJSON := map[string]any{"type": start.Type}
		if start.Type == "text" {
			startJSON["text"] = ""
		} else {
			startJSON["id"], startJSON["name"], startJSON["input"] = start.ID, start.Name, start.Input
		}
		event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": startJSON})
		if i == 0 {
			event("ping", map[string]any{"type": "ping"})
		}
		for _, d := range deltas {
			time.Sleep(5 * time.Millisecond)
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": d})
		}
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": 60}})
	event("message_stop", map[string]any{"type": "message_stop"})
}

// id returns a new id with prefix, unique within the server.
func (s *Server) id(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids++
	return fmt.Sprintf("%s_%d_%06d", prefix, time.Now().UnixNano()%1e6, s.ids)
}

// apiError answers as the API does when a call fails: the status and
// {"type":"error","error":{"type":...,"message":...}}.
func apiError(w http.ResponseWriter, code int, kind, msg string) {
	w.Header().Set("content-type", "application/json")
	if code == http.StatusTooManyRequests || code >= 500 {
		w.Header().Set("x-should-retry", "true")
	}
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%q}}`, kind, msg)
}
