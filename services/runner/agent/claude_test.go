package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/orch-dev/orch/services/runner/agent"
)

// The transcripts of the real CLI (testdata/README-claude.md), whose
// result objects print "type" last, judged with the exit code the CLI
// had.
func TestClaudeTranscripts(t *testing.T) {
	tests := []struct {
		file        string
		exit        int
		cost        float64
		turns       int
		session     string
		result      string
		errHas      []string
		denied      bool
		deniedTools []string
	}{
		{file: "success.jsonl", cost: 0.012, turns: 2, session: "95ffa790-2771-447b-9146-e8c991415820", result: "Done: added AGENT_WAS_HERE.md"},
		{file: "permission-denied.jsonl", cost: 0.012, turns: 2, session: "b06ba3bf-a677-4451-ab20-ce90df0a0022",
			errHas: []string{"denied Bash (1 call)", "allowed_tools: [Bash]"}, denied: true, deniedTools: []string{"Bash"}},
		{file: "api-error-500.jsonl", exit: 1, turns: 1, session: "0a2e2308-9d14-4a47-abab-3109b005c18e",
			errHas: []string{"(api_error, HTTP 500): API Error: 500 fake upstream exploded", "exit status 1"}},
		// Claude Code 2.1.197 ends an API failure with subtype "success"
		// and terminal_reason "completed": the error names the HTTP
		// status, not "success".
		{file: "api-error-500-2.1.197.jsonl", exit: 1, turns: 1, session: "7b9fa534-7a1f-480b-8a97-4f4e16f335cd",
			errHas: []string{"agent reported an error (HTTP 500): API Error: 500 Internal server error", "exit status 1"}},
		{file: "api-error-429-2.1.197.jsonl", exit: 1, turns: 1, session: "a02d9c7a-22ee-494c-bd46-161983064f23",
			errHas: []string{"agent reported an error (HTTP 429): API Error: Request rejected (429)", "exit status 1"}},
		// A call that got no answer within API_TIMEOUT_MS has no status.
		{file: "api-timeout-2.1.197.jsonl", exit: 1, turns: 1, session: "25ef39e2-1083-4e0f-ab2a-f352941d800e",
			errHas: []string{"agent reported an error: Request timed out (exit status 1)"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, err := agent.ParseClaudeResultFile(filepath.Join("testdata", tt.file))
			if err != nil || c == nil {
				t.Fatalf("parse: %v, %v", c, err)
			}
			if c.TotalCostUSD != tt.cost || c.NumTurns != tt.turns || c.SessionID != tt.session {
				t.Errorf("cost %v, turns %d, session %q; want %v, %d, %q", c.TotalCostUSD, c.NumTurns, c.SessionID, tt.cost, tt.turns, tt.session)
			}
			if tt.result != "" && c.Text() != tt.result {
				t.Errorf("result text %q, want %q", c.Text(), tt.result)
			}
			if !slices.Equal(c.DeniedTools(), tt.deniedTools) {
				t.Errorf("denied tools %q, want %q", c.DeniedTools(), tt.deniedTools)
			}
			// The process's own account, as agent.Run gives it.
			res := agent.Run(context.Background(), spec(t, []string{"sh", "-c", "exit " + strconv.Itoa(tt.exit)}))
			res = c.Judge(res)
			if len(tt.errHas) == 0 {
				if res.Err != nil {
					t.Errorf("judged %v, want success", res.Err)
				}
				return
			}
			if res.Err == nil {
				t.Fatal("judged a success, want a failure")
			}
			if strings.Contains(res.Err.Error(), "(success") {
				t.Errorf("error %q calls a failure a success", res.Err)
			}
			for _, want := range tt.errHas {
				if !strings.Contains(res.Err.Error(), want) {
					t.Errorf("error %q lacks %q", res.Err, want)
				}
			}
			if got := errors.Is(res.Err, agent.ErrPermissionDenied); got != tt.denied {
				t.Errorf("errors.Is(ErrPermissionDenied) = %v, want %v", got, tt.denied)
			}
		})
	}
}

// Claude Code's account does not replace orch's cause for stopping a run:
// the runner acts on that cause.
func TestClaudeJudgeKeepsStopCause(t *testing.T) {
	c, err := agent.ParseClaudeResultFile(filepath.Join("testdata", "api-error-500.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	stopped := agent.Result{ExitCode: -1, Err: agent.ErrTimeout}
	if got := c.Judge(stopped); !errors.Is(got.Err, agent.ErrTimeout) {
		t.Errorf("judged %v, want the timeout kept", got.Err)
	}
	var none *agent.ClaudeResult
	if got := none.Judge(stopped); got != stopped {
		t.Errorf("nil result changed %+v to %+v", stopped, got)
	}
}

// Output of other agents, or none, is no result.
func TestParseClaudeResultIgnoresOtherOutput(t *testing.T) {
	for _, in := range []string{"", "plain output\n", `{"type":"other"}` + "\n", `{"result":"x","type":"assistant"}`, "{not json\n"} {
		if c, err := agent.ParseClaudeResult(strings.NewReader(in)); c != nil || err != nil {
			t.Errorf("%q parsed as %+v, %v", in, c, err)
		}
	}
}

// A long final message is cut to ResultTextMax bytes at a character
// boundary, and says so.
func TestClaudeResultTextIsCut(t *testing.T) {
	long := strings.Repeat("é", agent.ResultTextMax) // two bytes each
	c := &agent.ClaudeResult{Result: long}
	got := c.Text()
	if len(got) > agent.ResultTextMax || !utf8.ValidString(got) || !strings.HasSuffix(got, "[…]") {
		t.Errorf("cut to %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[max(0, len(got)-10):])
	}
	c = &agent.ClaudeResult{IsError: true, Subtype: "error_during_execution", Result: long}
	if msg := c.Err().Error(); len(msg) > agent.ErrorTextMax+100 {
		t.Errorf("error text is %d bytes, want about ErrorTextMax", len(msg))
	}
}

func TestWithPermissions(t *testing.T) {
	base := []string{"claude", "-p"}
	tests := []struct {
		name              string
		argv              []string
		mode              string
		allowed, disallow []string
		want              []string
	}{
		{"all", base, "acceptEdits", []string{"Bash", "Bash(go test:*)"}, []string{"WebFetch"},
			[]string{"claude", "-p", "--permission-mode", "acceptEdits", "--disallowedTools", "WebFetch", "--allowedTools", "Bash", "Bash(go test:*)"}},
		{"nothing", base, "", nil, nil, base},
		{"operator's flags win", []string{"claude", "-p", "--permission-mode=plan", "--allowedTools", "Read"}, "acceptEdits", []string{"Bash"}, nil,
			[]string{"claude", "-p", "--permission-mode=plan", "--allowedTools", "Read"}},
		{"skip permissions wins", []string{"claude", "--dangerously-skip-permissions"}, "acceptEdits", nil, nil,
			[]string{"claude", "--dangerously-skip-permissions"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := agent.WithPermissions(tt.argv, tt.mode, tt.allowed, tt.disallow); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	if !agent.IsClaude([]string{"/usr/local/bin/claude", "-p"}) || agent.IsClaude([]string{"sh", "claude"}) || agent.IsClaude(nil) {
		t.Error("IsClaude does not go by the program's name")
	}
}

// With the retries the runner gives Claude Code and Claude Code's own API
// timeout, one failing call ends well inside the default 60 minute
// watchdog, so an outage ends in Claude Code's error text.
func TestClaudeRetrySpanFitsTheDefaultWatchdog(t *testing.T) {
	span := agent.ClaudeRetrySpan(agent.ClaudeMaxRetriesDefault, agent.ClaudeAPITimeoutDefault)
	if want := 50*time.Minute + 9375*time.Millisecond; span != want {
		t.Errorf("span %v, want %v: 5 tries of 10 minutes and 0.5+1+2+4 s of backoff, each with up to 25%% jitter", span, want)
	}
	if span >= 60*time.Minute {
		t.Errorf("span %v is not below the default watchdog of 60m", span)
	}
	if got := agent.ClaudeRetrySpan(10, time.Second); got != 11*time.Second+(500+1000+2000+4000+8000+16000+32000*4)*1250*time.Microsecond {
		t.Errorf("10 retries of 1s: span %v; the backoff caps at 32s", got)
	}
}
