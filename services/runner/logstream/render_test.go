package logstream

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// renderFile renders a transcript from testdata line by line.
func renderFile(t *testing.T, name string) (string, *Renderer) {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := NewRenderer()
	var out []byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		out = r.Line(out, sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return string(out), r
}

func TestRenderClaudeTranscript(t *testing.T) {
	got, r := renderFile(t, "success.jsonl")
	want := `── session 95ffa790-2771-447b-9146-e8c991415820: model claude-opus-5-5, 22 tools, in /srv/orch/workspace/worktrees/widgets/pr-42
I will add AGENT_WAS_HERE.md and commit it.
→ Bash: printf '# Agent was here\n' > AGENT_WAS_HERE.md && git add AGENT_WAS_HERE.md && git commit -q -m 'Add AGENT_WAS_HERE.md' && git log --oneline -1
Done: added AGENT_WAS_HERE.md
══ result: success, 2 turns, $0.0120, 224ms
`
	if got != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", got, want)
	}
	if p := r.Progress(); p.Turns != 2 || p.CostUSD != 0.012 {
		t.Errorf("progress %+v, want 2 turns and $0.012", p)
	}
}

func TestRenderToolErrorsAndFailures(t *testing.T) {
	got, _ := renderFile(t, "permission-denied.jsonl")
	for _, want := range []string{
		"✗ permission denied for Bash: This Bash command contains multiple operations.",
		"✗ tool error: This Bash command contains multiple operations.",
		"1 tool call(s) denied permission",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	got, _ = renderFile(t, "api-error-500.jsonl")
	for _, want := range []string{
		"⚠ API error 500 (server_error): retry 1 of 1 in 529ms",
		"API Error: 500 fake upstream exploded",
		"══ result: error (",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

func TestRenderKeepsWhatItDoesNotKnow(t *testing.T) {
	for _, line := range []string{
		`{"type":"rate_limit_event","subtype":"x","session_id":"s"}`,
		`{"type":"system","subtype":"compact_boundary","session_id":"s"}`,
		`{"type":"assistant","message":{"id":"m","content":[{"type":"server_tool_use","name":"web"}]}}`,
		`{"not":"an event"}`,
		`{broken json`,
		`plain text from the agent`,
	} {
		if got := string(NewRenderer().Line(nil, []byte(line))); got != line+"\n" {
			t.Errorf("%s rendered as %q, want it as it is", line, got)
		}
	}
}

func TestRenderEscapesInvalidUTF8(t *testing.T) {
	got := string(NewRenderer().Line(nil, []byte("ok é \xff\xfe end \xc3")))
	if want := `ok é \xff\xfe end \xc3` + "\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A priced renderer estimates the spend from each assistant message's
// latest usage (its events repeat it), and takes the reported cost once
// the result comes.
func TestRenderEstimatesSpend(t *testing.T) {
	r := NewPricedRenderer(func(model string, u Usage) float64 {
		if model != "m" {
			return 0
		}
		return float64(u.OutputTokens) / 100
	})
	for _, line := range []string{
		`{"type":"assistant","message":{"id":"a","model":"m","usage":{"output_tokens":10},"content":[{"type":"text","text":"x"}]}}`,
		`{"type":"assistant","message":{"id":"a","model":"m","usage":{"output_tokens":30},"content":[{"type":"text","text":"y"}]}}`,
		`{"type":"assistant","message":{"id":"b","model":"m","usage":{"output_tokens":20},"content":[{"type":"text","text":"z"}]}}`,
	} {
		r.Line(nil, []byte(line))
	}
	if got := r.Progress().SpentUSD; got != 0.5 {
		t.Errorf("estimated %v, want 0.5 (0.3 for a's latest usage, 0.2 for b)", got)
	}
	r.Line(nil, []byte(`{"type":"result","subtype":"success","num_turns":2,"total_cost_usd":0.75}`))
	if p := r.Progress(); p.SpentUSD != 0.75 || p.CostUSD != 0.75 {
		t.Errorf("after the result: %+v, want the reported 0.75", p)
	}
}
