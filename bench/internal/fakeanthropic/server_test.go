package fakeanthropic_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/bench/internal/fakeanthropic"
)

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url+"/v1/messages", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// The first turn of the commit script streams, in the API's order of
// events, a text and a Bash call whose input deltas join into the
// command; the turn after the tool result ends with a text.
func TestCommitScriptStreams(t *testing.T) {
	srv := httptest.NewServer(&fakeanthropic.Server{Default: "text"})
	defer srv.Close()
	resp := post(t, srv.URL, `{"model":"m","stream":true,"tools":[{"name":"Bash"}],"messages":[{"role":"user","content":"do it fake:commit"}]}`)
	if ct := resp.Header.Get("content-type"); ct != "text/event-stream" {
		t.Fatalf("content-type %q", ct)
	}
	var events []string
	var input strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, name)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var ev struct {
				Delta struct {
					PartialJSON string `json:"partial_json"`
				} `json:"delta"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("data %q: %v", data, err)
			}
			input.WriteString(ev.Delta.PartialJSON)
		}
	}
	want := []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	var cmd struct{ Command string }
	if err := json.Unmarshal([]byte(input.String()), &cmd); err != nil || cmd.Command != fakeanthropic.CommitCommand {
		t.Errorf("tool input %q (%v), want the commit command", input.String(), err)
	}

	resp = post(t, srv.URL, `{"model":"m","tools":[{"name":"Bash"}],"messages":[{"role":"user","content":"fake:commit"},`+
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":"1a2b3c4 Add"}]}]}`)
	var msg struct {
		StopReason string `json:"stop_reason"`
		Content    []struct{ Text string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || msg.StopReason != "end_turn" || msg.Content[0].Text != "Done: added AGENT_WAS_HERE.md" {
		t.Errorf("final turn %+v (%v)", msg, err)
	}
}

// The push script calls Bash with the commit and a push of the branch,
// and ends once the tool result comes back.
func TestPushScript(t *testing.T) {
	srv := httptest.NewServer(&fakeanthropic.Server{Default: "text"})
	defer srv.Close()
	var msg struct {
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type  string
			Text  string
			Input struct{ Command string }
		}
	}
	resp := post(t, srv.URL, `{"model":"m","tools":[{"name":"Bash"}],"messages":[{"role":"user","content":"do it fake:push"}]}`)
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || msg.StopReason != "tool_use" || len(msg.Content) != 2 ||
		msg.Content[1].Input.Command != fakeanthropic.PushCommand || !strings.Contains(fakeanthropic.PushCommand, "git push") {
		t.Fatalf("first turn %+v (%v), want a Bash call of the push command", msg, err)
	}
	resp = post(t, srv.URL, `{"model":"m","tools":[{"name":"Bash"}],"messages":[{"role":"user","content":"fake:push"},`+
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":"pushed"}]}]}`)
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || msg.StopReason != "end_turn" || msg.Content[0].Text != "Done: added AGENT_WAS_HERE.md and pushed it" {
		t.Errorf("final turn %+v (%v)", msg, err)
	}
}

// The error scripts answer as the API does: the status, an error object,
// and retry-after on 429.
func TestErrorScripts(t *testing.T) {
	srv := httptest.NewServer(&fakeanthropic.Server{Default: "500"})
	defer srv.Close()
	for body, want := range map[string]int{`{"model":"m"}`: 500, `{"model":"m","messages":[{"role":"user","content":"fake:429"}]}`: 429} {
		resp := post(t, srv.URL, body)
		var e struct {
			Type  string
			Error struct{ Type string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != want || e.Type != "error" || e.Error.Type == "" {
			t.Errorf("%s: status %d, body %+v (%v); want %d and an error object", body, resp.StatusCode, e, err, want)
		}
		if want == 429 && resp.Header.Get("retry-after") != "1" {
			t.Error("429 without retry-after")
		}
	}
}
