package writeback

import (
	"net/http"
	"testing"
	"time"
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
