package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

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
	// Result is the agent's final message (on success) or error text.
	Result string `json:"result"`
}

// Err is the failure the result reports, or nil. Claude Code can exit 0
// and still report is_error, for example when it ran out of turns.
func (c *ClaudeResult) Err() error {
	if !c.IsError {
		return nil
	}
	msg := c.Result
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return fmt.Errorf("agent reported an error (%s): %s", c.Subtype, msg)
}

// resultMarker is how a stream-json result line starts; other lines are
// skipped without decoding.
var resultMarker = []byte(`"type":"result"`)

// ParseClaudeResult returns the last result object in r, a stream-json
// transcript possibly mixed with other output (the agent's log holds both
// stdout and stderr). It returns nil when there is none.
func ParseClaudeResult(r io.Reader) (*ClaudeResult, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var last *ClaudeResult
	for {
		line, err := br.ReadBytes('\n')
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '{' && bytes.Contains(compact(t), resultMarker) {
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

// compact removes the spaces a pretty printer may put after the colon of
// the type field, which is all the marker test needs; only the head of a
// line is looked at, since "type" comes first in Claude Code's objects.
func compact(line []byte) []byte {
	head := line[:min(len(line), 64)]
	return bytes.ReplaceAll(bytes.ReplaceAll(head, []byte(`": "`), []byte(`":"`)), []byte(`" : "`), []byte(`":"`))
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
