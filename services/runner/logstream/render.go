package logstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on what one rendered event shows, so that a huge tool input or
// error does not bury the rest; the raw view keeps all of it.
const (
	maxArgLen   = 200
	maxErrorLen = 1000
)

// Renderer turns the agent's output into readable lines, one raw line at
// a time. Claude Code's stream-json events (one JSON object per line) are
// rendered: session start, assistant text, each tool call with its main
// argument, tool errors, retries, permission denials and the final result
// with turns, cost and duration. Any other line, and any event it does
// not know, is kept as it is: nothing is dropped. Each line is decoded as
// JSON whole, since Claude Code prints "type" anywhere in its objects.
//
// Invalid UTF-8 in a readable line is escaped as \xNN, so the readable
// view is always valid UTF-8; the raw view keeps the bytes.
//
// A Renderer also keeps the progress the events report. It is not safe
// for concurrent use.
type Renderer struct {
	turns    map[string]struct{}
	progress Progress
	// price prices one message's usage (nil: nothing is estimated);
	// costs holds each assistant message's latest estimate, by id, as
	// its events repeat the message's usage so far.
	price func(model string, u Usage) float64
	costs map[string]float64
	spent float64
}

// Usage is the token counts of one assistant message, as its stream-json
// event reports them.
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// Progress is what the agent's output says of its run so far.
type Progress struct {
	// Turns is the number of assistant messages so far, or the turns its
	// final result reports.
	Turns int
	// CostUSD is the cost the agent reported; Claude Code reports it only
	// in its final result.
	CostUSD float64
	// SpentUSD is what the output shows spent so far: CostUSD once it is
	// reported, before that the assistant messages' usage priced (an
	// estimate: a message's event may show its output tokens before the
	// message is done).
	SpentUSD float64
}

// NewRenderer returns a Renderer with no progress yet.
func NewRenderer() *Renderer {
	return &Renderer{turns: make(map[string]struct{})}
}

// NewPricedRenderer is NewRenderer that also estimates the spend from the
// assistant messages' usage, priced by price.
func NewPricedRenderer(price func(model string, u Usage) float64) *Renderer {
	r := NewRenderer()
	r.price, r.costs = price, map[string]float64{}
	return r
}

// Progress returns the progress seen so far.
func (r *Renderer) Progress() Progress { return r.progress }

// event is the part of a stream-json event the renderer reads.
type event struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	// system init
	Model     string   `json:"model"`
	Cwd       string   `json:"cwd"`
	SessionID string   `json:"session_id"`
	Tools     []string `json:"tools"`
	// system api_retry
	Attempt      int    `json:"attempt"`
	MaxRetries   int    `json:"max_retries"`
	RetryDelayMS int64  `json:"retry_delay_ms"`
	ErrorStatus  int    `json:"error_status"`
	Error        string `json:"error"`
	// system permission_denied
	ToolName string          `json:"tool_name"`
	Message  json.RawMessage `json:"message"`
	// result
	IsError           bool              `json:"is_error"`
	NumTurns          int               `json:"num_turns"`
	TotalCostUSD      float64           `json:"total_cost_usd"`
	DurationMS        int64             `json:"duration_ms"`
	Result            string            `json:"result"`
	PermissionDenials []json.RawMessage `json:"permission_denials"`
}

// message is the message of an assistant or user event.
type message struct {
	ID      string  `json:"id"`
	Model   string  `json:"model"`
	Usage   *Usage  `json:"usage"`
	Content []block `json:"content"`
}

// block is one content block of a message.
type block struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"`
	IsError bool            `json:"is_error"`
}

// Line renders one raw line (without its line break) and appends the
// result, each line ending in a line break, to dst.
func (r *Renderer) Line(dst, line []byte) []byte {
	if IsEvent(line) {
		var ev event
		if json.Unmarshal(bytes.TrimSpace(line), &ev) == nil {
			if out, ok := r.render(&ev); ok {
				return append(dst, out...)
			}
		}
	}
	dst = AppendEscaped(dst, line)
	return append(dst, '\n')
}

// IsEvent reports whether Line decodes line as a JSON object; any other
// line's readable form is the line itself, escaped where it is not
// valid UTF-8.
func IsEvent(line []byte) bool {
	t := bytes.TrimSpace(line)
	return len(t) > 1 && t[0] == '{' && t[len(t)-1] == '}'
}

// render returns the readable form of a known event, or false.
func (r *Renderer) render(ev *event) (string, bool) {
	var b strings.Builder
	switch ev.Type {
	case "system":
		switch ev.Subtype {
		case "init":
			fmt.Fprintf(&b, "── session %s: model %s, %d tools, in %s\n", ev.SessionID, ev.Model, len(ev.Tools), ev.Cwd)
		case "api_retry":
			fmt.Fprintf(&b, "⚠ API error %d (%s): retry %d of %d in %v\n", ev.ErrorStatus, ev.Error, ev.Attempt, ev.MaxRetries,
				time.Duration(ev.RetryDelayMS)*time.Millisecond)
		case "permission_denied":
			var msg string
			_ = json.Unmarshal(ev.Message, &msg)
			fmt.Fprintf(&b, "✗ permission denied for %s: %s\n", ev.ToolName, cut(msg, maxErrorLen))
		default:
			return "", false
		}
	case "assistant", "user":
		var m message
		if json.Unmarshal(ev.Message, &m) != nil {
			return "", false
		}
		if ev.Type == "assistant" && m.ID != "" {
			r.turns[m.ID] = struct{}{}
			r.progress.Turns = max(r.progress.Turns, len(r.turns))
			if r.price != nil && m.Usage != nil {
				c := r.price(m.Model, *m.Usage)
				r.spent += c - r.costs[m.ID]
				r.costs[m.ID] = c
				r.progress.SpentUSD = max(r.progress.SpentUSD, r.spent)
			}
		}
		for _, c := range m.Content {
			if !renderBlock(&b, c) {
				return "", false
			}
		}
	case "result":
		r.progress.Turns, r.progress.CostUSD = ev.NumTurns, ev.TotalCostUSD
		r.progress.SpentUSD = max(r.progress.SpentUSD, ev.TotalCostUSD)
		outcome := ev.Subtype
		if ev.IsError {
			outcome = "error (" + ev.Subtype + ")"
		}
		fmt.Fprintf(&b, "══ result: %s, %d turns, $%.4f, %v\n", outcome, ev.NumTurns, ev.TotalCostUSD,
			(time.Duration(ev.DurationMS) * time.Millisecond).Round(time.Millisecond))
		if ev.IsError && ev.Result != "" {
			fmt.Fprintf(&b, "   %s\n", cut(ev.Result, maxErrorLen))
		}
		if n := len(ev.PermissionDenials); n > 0 {
			fmt.Fprintf(&b, "   %d tool call(s) denied permission: nothing they asked for was done\n", n)
		}
	default:
		return "", false
	}
	return b.String(), true
}

// renderBlock writes one content block; false for a block it does not
// know, so that the event is shown raw instead.
func renderBlock(b *strings.Builder, c block) bool {
	switch c.Type {
	case "text":
		if t := strings.TrimRight(c.Text, "\n"); t != "" {
			b.WriteString(t)
			b.WriteByte('\n')
		}
	case "tool_use":
		fmt.Fprintf(b, "→ %s: %s\n", c.Name, mainArg(c.Input))
	case "tool_result":
		if c.IsError {
			fmt.Fprintf(b, "✗ tool error: %s\n", cut(resultText(c.Content), maxErrorLen))
		}
	case "thinking", "redacted_thinking":
		// Thinking is the model's own scratch work: the raw view has it.
	default:
		return false
	}
	return true
}

// mainArgKeys are the tool input fields that say what a call does, most
// telling first: Bash's command, the file of Read/Edit/Write, a search
// pattern, a URL, a sub-agent's description.
var mainArgKeys = []string{"command", "file_path", "notebook_path", "path", "pattern", "url", "query", "description", "prompt"}

// mainArg returns the main argument of a tool call on one line, or its
// whole input, cut short.
func mainArg(input json.RawMessage) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(input, &fields) == nil {
		for _, k := range mainArgKeys {
			var s string
			if v, ok := fields[k]; ok && json.Unmarshal(v, &s) == nil && s != "" {
				return cut(oneLine(s), maxArgLen)
			}
		}
	}
	return cut(oneLine(string(input)), maxArgLen)
}

// resultText is a tool result's content: a string, or a list of blocks
// whose text is joined.
func resultText(content json.RawMessage) string {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s
	}
	var blocks []block
	if json.Unmarshal(content, &blocks) == nil {
		var parts []string
		for _, c := range blocks {
			if c.Text != "" {
				parts = append(parts, c.Text)
			}
		}
		return strings.Join(parts, "\n")
	}
	return string(content)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// cut shortens s to about n bytes, on a rune boundary, saying so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// AppendEscaped appends b to dst with every byte that is not part of
// valid UTF-8 written as \xNN.
func AppendEscaped(dst, b []byte) []byte {
	if utf8.Valid(b) {
		return append(dst, b...)
	}
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			dst = fmt.Appendf(dst, `\x%02x`, b[0])
		} else {
			dst = append(dst, b[:size]...)
		}
		b = b[size:]
	}
	return dst
}
