package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/orch-dev/orch/kit/tail"
)

// Limits on what of Claude Code's result reaches the status record, which
// is a KV value read by every dashboard and alert: the final message is
// kept in full up to ResultTextMax bytes, an error text up to ErrorTextMax.
// Longer texts are cut at a character boundary and end in "[…]"; the whole
// text stays in the attempt's log.
const (
	ResultTextMax = 4096
	ErrorTextMax  = 1024
)

// ErrPermissionDenied is wrapped by the error of a run in which Claude Code
// was denied tools, or refused its permission settings altogether (it will
// not bypass permissions as root). Print mode cannot ask anyone for
// approval and the runner's user does not change between attempts, so a
// retry would fail the same way: the runner fails such a job at once.
var ErrPermissionDenied = errors.New("tools denied")

// rootRefusal is what Claude Code prints, and then exits 1, when it is
// asked to bypass permissions (--dangerously-skip-permissions, permission
// mode bypassPermissions) as root.
const rootRefusal = "cannot be used with root/sudo privileges"

// ClaudeResult is the final "result" object Claude Code prints with
// --output-format stream-json (or json): what the run cost and how it ended.
type ClaudeResult struct {
	Type         string  `json:"type"`
	Subtype      string  `json:"subtype"`
	IsError      bool    `json:"is_error"`
	NumTurns     int     `json:"num_turns"`
	TotalCostUSD float64 `json:"total_cost_usd"`
	SessionID    string  `json:"session_id"`
	DurationMS   int64   `json:"duration_ms"`
	// Result is the agent's final message (on success) or error text,
	// such as "API Error: 500 ...".
	Result string `json:"result"`
	// TerminalReason says why the run ended ("completed", "api_error",
	// ...); older versions print only Subtype ("error_max_turns"). A run
	// that ended on an API error may still say "completed" with subtype
	// "success" and is_error true (Claude Code 2.1.197).
	TerminalReason string `json:"terminal_reason"`
	// APIErrorStatus is the HTTP status of the API call that ended the
	// run (500, 429, ...); 0 when there was none or no answer at all (a
	// timed-out call).
	APIErrorStatus int `json:"api_error_status"`
	// PermissionDenials are the tool calls nobody approved. A run with
	// any exits 0 and reports no error, yet did not do what they would
	// have done.
	PermissionDenials []PermissionDenial `json:"permission_denials"`
}

// PermissionDenial is one tool call Claude Code was not allowed to make.
type PermissionDenial struct {
	ToolName  string          `json:"tool_name"`
	ToolUseID string          `json:"tool_use_id"`
	ToolInput json.RawMessage `json:"tool_input"`
}

// Text is the final message, cut to ResultTextMax bytes.
func (c *ClaudeResult) Text() string { return cut(c.Result, ResultTextMax) }

// DeniedTools names the denied tools, each once, in the order first denied.
func (c *ClaudeResult) DeniedTools() []string {
	var tools []string
	for _, d := range c.PermissionDenials {
		if d.ToolName != "" && !slices.Contains(tools, d.ToolName) {
			tools = append(tools, d.ToolName)
		}
	}
	return tools
}

// Err is the failure the result reports, or nil. Denied tools come first
// (the error is ErrPermissionDenied for errors.Is and says what to allow); then
// is_error, with Claude Code's own error text. Claude Code can exit 0 and
// still report either.
func (c *ClaudeResult) Err() error {
	if tools := c.DeniedTools(); len(tools) > 0 {
		return &deniedError{fmt.Sprintf("Claude Code was denied %s (%d %s): print mode cannot ask for approval, so it did not do what they were for; "+
			"allow them in the project's agent_permissions in the registry (%s)",
			strings.Join(tools, ", "), len(c.PermissionDenials), plural(len(c.PermissionDenials), "call", "calls"), howToAllow(tools))}
	}
	if !c.IsError {
		return nil
	}
	var why []string
	switch {
	case c.TerminalReason != "" && c.TerminalReason != "completed":
		why = append(why, c.TerminalReason)
	case c.Subtype != "" && c.Subtype != "success":
		why = append(why, c.Subtype)
	}
	if c.APIErrorStatus != 0 {
		why = append(why, fmt.Sprintf("HTTP %d", c.APIErrorStatus))
	}
	text := cut(strings.TrimSpace(c.Result), ErrorTextMax)
	if len(why) == 0 {
		return fmt.Errorf("agent reported an error: %s", text)
	}
	return fmt.Errorf("agent reported an error (%s): %s", strings.Join(why, ", "), text)
}

// Judge folds Claude Code's account of a run into res, the account of its
// process. A run that exited 0 fails when the result reports an error or
// denied tools; a run that exited non-zero gets Claude Code's own error
// text (e.g. "API Error: 500 ...") instead of a bare exit status. A run
// stopped by orch (watchdog, cancel, shutdown) keeps its cause, which the
// runner acts on. c may be nil: res is returned as it is.
func (c *ClaudeResult) Judge(res Result) Result {
	if c == nil {
		return res
	}
	err := c.Err()
	if err == nil {
		return res
	}
	var exit *ExitError
	switch {
	case res.Err == nil:
		res.Err = err
	case errors.As(res.Err, &exit):
		res.Err = fmt.Errorf("%w (%v)", err, exit)
	}
	return res
}

// JudgeWithoutResult is Judge for a Claude Code run that printed no result
// object, because Claude Code refused to start (as root with
// bypassPermissions, an unknown flag, no credentials) or died. A non-zero
// exit gets the last line of the attempt's log at logPath, where Claude
// Code printed why, instead of a bare exit status. A refusal to bypass
// permissions as root is ErrPermissionDenied and says to run the runner as
// a non-root user: every retry would be refused the same way. A run
// stopped by orch keeps its cause.
func JudgeWithoutResult(res Result, logPath string) Result {
	var exit *ExitError
	if !errors.As(res.Err, &exit) || errors.Is(res.Err, ErrTimeout) {
		return res
	}
	line := lastLine(logPath)
	switch {
	case strings.Contains(line, rootRefusal):
		// The advice comes first: a JetStream term reason keeps only the
		// start of the text.
		res.Err = &deniedError{fmt.Sprintf("Claude Code refuses to bypass permissions as root: run the runner as a non-root user "+
			"(the shipped images, systemd units and manifests do), or give the project an agent_permissions mode other "+
			"than bypassPermissions; a retry would be refused the same way (%v: %s)", res.Err, cut(line, ErrorTextMax))}
	case line != "":
		res.Err = fmt.Errorf("%w: %s", res.Err, cut(line, ErrorTextMax))
	}
	return res
}

// lastLine is the last non-empty line of the file at path, read from its
// last 4 KiB; "" when there is none or the file cannot be read.
func lastLine(path string) string {
	lines := tail.Lines(path, 4<<10, 4<<10)
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

// howToAllow says what agent_permissions setting would allow tools: file
// edits by mode acceptEdits, anything else by name in allowed_tools.
func howToAllow(tools []string) string {
	var allow []string
	edits := false
	for _, t := range tools {
		switch t {
		case "Edit", "Write", "MultiEdit", "NotebookEdit":
			edits = true
		default:
			allow = append(allow, t)
		}
	}
	var parts []string
	if len(allow) > 0 {
		parts = append(parts, "allowed_tools: ["+strings.Join(allow, ", ")+"], or a narrower rule such as \"Bash(go test:*)\"")
	}
	if edits {
		parts = append(parts, "mode: acceptEdits for file edits")
	}
	return strings.Join(parts, "; ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// cut shortens s to at most n bytes at a character boundary, marking the
// cut.
func cut(s string, n int) string {
	const mark = " […]"
	if len(s) <= n {
		return s
	}
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + mark
}

// deniedError is the error of a run with denied tools or refused
// permission settings: its text says what to change, and it is
// ErrPermissionDenied for errors.Is.
type deniedError struct{ msg string }

func (e *deniedError) Error() string        { return e.msg }
func (e *deniedError) Is(target error) bool { return target == ErrPermissionDenied }

// ParseClaudeResult returns the last result object in r, a stream-json
// transcript possibly mixed with other output (the agent's log holds both
// stdout and stderr). Every line that is a JSON object is decoded: the
// "type" field may come anywhere in it (Claude Code 2.1 prints it late).
// It returns nil when there is no result object.
func ParseClaudeResult(r io.Reader) (*ClaudeResult, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var last *ClaudeResult
	for {
		line, err := br.ReadBytes('\n')
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '{' {
			var c ClaudeResult
			if json.Unmarshal(t, &c) == nil && c.Type == "result" {
				last = &c
			}
		}
		if errors.Is(err, io.EOF) {
			return last, nil
		}
		if err != nil {
			return last, fmt.Errorf("reading transcript: %w", err)
		}
	}
}

// ParseClaudeResultFile is ParseClaudeResult on the file at path.
func ParseClaudeResultFile(path string) (*ClaudeResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening agent log: %w", err)
	}
	defer f.Close()
	return ParseClaudeResult(f)
}

// IsClaude reports whether argv runs Claude Code: its program is named
// "claude" (a path to it, or the name looked up in PATH). Flags orch adds
// for Claude Code are added only then; any other agent gets its argv as
// configured.
func IsClaude(argv []string) bool {
	return len(argv) > 0 && filepath.Base(argv[0]) == "claude"
}

// The environment variables through which Claude Code retries API calls.
const (
	// ClaudeMaxRetriesEnv is how often Claude Code retries a failed API
	// call, with a backoff from 0.5s doubling up to 32s (Claude Code's
	// default is 10).
	ClaudeMaxRetriesEnv = "CLAUDE_CODE_MAX_RETRIES"
	// ClaudeMaxRetriesDefault is what the runner sets when the runner's
	// environment does not: 7.5 to 9.4s of backoff rides out a blip, and a
	// longer outage ends the run with Claude Code's error text, which the
	// status record keeps, and is retried by orch after ORCH_RETRY_DELAY,
	// spread over minutes instead of seconds.
	ClaudeMaxRetriesDefault = 4
	// ClaudeAPITimeoutEnv bounds one API call, in milliseconds (Claude
	// Code's default is 600000, 10 minutes).
	ClaudeAPITimeoutEnv = "API_TIMEOUT_MS"
)

// WithPermissions returns argv with Claude Code's permission flags for
// mode and the tool rules appended. A flag the command already has is not
// added again: an operator's own flags win. The variadic tool lists come
// last, one rule a word, so that no later word is taken for a rule.
func WithPermissions(argv []string, mode string, allowed, disallowed []string) []string {
	out := slices.Clone(argv)
	has := func(names ...string) bool {
		return slices.ContainsFunc(argv[1:], func(a string) bool {
			for _, n := range names {
				if a == n || strings.HasPrefix(a, n+"=") {
					return true
				}
			}
			return false
		})
	}
	if mode != "" && !has("--permission-mode", "--dangerously-skip-permissions") {
		out = append(out, "--permission-mode", mode)
	}
	if len(disallowed) > 0 && !has("--disallowedTools", "--disallowed-tools") {
		out = append(append(out, "--disallowedTools"), disallowed...)
	}
	if len(allowed) > 0 && !has("--allowedTools", "--allowed-tools") {
		out = append(append(out, "--allowedTools"), allowed...)
	}
	return out
}

// ClaudeAPITimeoutDefault is Claude Code's own bound on one API call.
const ClaudeAPITimeoutDefault = 10 * time.Minute

// ClaudeRetrySpan is the longest Claude Code can spend on one API call
// that keeps failing: every try running into the API timeout, plus the
// backoff between tries (0.5s doubling, at most 32s each, plus up to a
// quarter of it in jitter: Claude Code 2.1.197 waited 0.55, 1.15, 2.50
// and 4.61 s). A watchdog shorter than this can stop the agent in the
// middle of its own retries, and the job's error is then a timeout
// instead of the API's error text.
func ClaudeRetrySpan(retries int, apiTimeout time.Duration) time.Duration {
	span := time.Duration(retries+1) * apiTimeout
	for i := range retries {
		backoff := min(500*time.Millisecond<<min(i, 6), 32*time.Second)
		span += backoff + backoff/4
	}
	return span
}
