package writeback

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

func TestRetryAfter(t *testing.T) {
	if got := retryAfter("7"); got != 7*time.Second {
		t.Errorf("retryAfter(7) = %v", got)
	}
	if got := retryAfter(time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)); got < 59*time.Minute {
		t.Errorf("retryAfter(date an hour ahead) = %v", got)
	}
	if got := retryAfter("soon"); got != 0 {
		t.Errorf("retryAfter(soon) = %v", got)
	}
}

func TestErrorText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"message":"[Body]: Required","url":"/api/swagger"}`, "[Body]: Required"},
		{`{"message":"","url":"http://127.0.0.1:3000/api/swagger"}`, "no message (see the tracker's log)"},
		{`{"detail":"Authentication credentials were not provided."}`, "Authentication credentials were not provided."},
		{`<html>Bad Gateway</html>`, "<html>Bad Gateway</html>"},
	} {
		if got := errorText([]byte(tc.in)); got != tc.want {
			t.Errorf("errorText(%s) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A held job's comment and commit status say why it waits and until
// when, instead of nothing.
func TestHeldText(t *testing.T) {
	until := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for reason, want := range map[string]string{
		proto.HoldOverBudget: "held: budget spent",
		proto.HoldUsageLimit: "waiting for the usage limit to reset at 2026-12-02 00:00 UTC",
		proto.HoldOperator:   "paused the project",
	} {
		st := &proto.Status{Job: proto.Job{ID: "j", Kind: proto.KindReview}, State: proto.StateHeld, HeldReason: reason, HeldUntil: until}
		if body := GiteaBody(View{Status: st}); !strings.Contains(body, want) {
			t.Errorf("%s: comment %q, want it to say %q", reason, body, want)
		}
		if cs := StatusOf(st, ""); cs.State != "pending" || !strings.Contains(cs.Description, want[:12]) {
			t.Errorf("%s: commit status %+v", reason, cs)
		}
	}
}

// A superseded job's comment names the job that replaced it.
func TestSupersededText(t *testing.T) {
	st := &proto.Status{Job: proto.Job{ID: "j1", Kind: proto.KindReview}, State: proto.StateCancelled,
		Error: proto.ReasonSuperseded, SupersededBy: "j3"}
	if body := GiteaBody(View{Status: st}); !strings.Contains(body, "Superseded") || !strings.Contains(body, "j3") {
		t.Errorf("comment %q does not name the job that replaced it", body)
	}
}
