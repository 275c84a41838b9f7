package telegram

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const token = "42:SECRET"

// fake answers every sendMessage with code and body.
func fake(t *testing.T, code int, body string) (*Client, *testkit.Telegram) {
	t.Helper()
	srv := testkit.NewTelegram(t, token)
	srv.SetAnswer(func(int) (int, string) { return code, body })
	return &Client{BaseURL: srv.URL + "/", Token: token, ChatID: "-100", ThreadID: 9, Rate: 20, HTTP: srv.Client()}, srv
}

func TestSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		code     int
		body     string
		rejected bool
		retry    time.Duration
	}{
		{"ok", 200, `{"ok":true,"result":{"message_id":1}}`, false, 0},
		{"429", 429, `{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}`, false, 3 * time.Second},
		{"500", 500, `{"ok":false,"error_code":500,"description":"Internal Server Error"}`, false, 0},
		{"502 html", 502, `<html>Bad Gateway</html>`, false, 0},
		{"400", 400, `{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}`, true, 0},
		{"401", 401, `{"ok":false,"error_code":401,"description":"Unauthorized"}`, true, 0},
		{"403", 403, `{"ok":false,"error_code":403,"description":"Forbidden: bot was kicked from the group chat"}`, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, srv := fake(t, tc.code, tc.body)
			err := c.Send(context.Background(), "<b>hi</b>")
			if got := srv.Received(); len(got) != 1 || got[0].Text != "<b>hi</b>" || got[0].ParseMode != "HTML" || got[0].Chat != "-100" || got[0].Thread != 9 {
				t.Errorf("requests %+v", got)
			}
			var rl *RateLimitedError
			switch {
			case tc.code == 200 && err != nil:
				t.Errorf("Send = %v", err)
			case tc.code == 200:
			case tc.rejected != errors.Is(err, ErrRejected):
				t.Errorf("Send = %v, rejected want %v", err, tc.rejected)
			case tc.retry > 0 && (!errors.As(err, &rl) || rl.RetryAfter != tc.retry):
				t.Errorf("Send = %v, want retry after %v", err, tc.retry)
			case err == nil:
				t.Error("Send = nil")
			}
			if err != nil && strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func TestWaitHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	c, _ := fake(t, 429, `{"ok":false,"error_code":429,"parameters":{"retry_after":1}}`)
	if err := c.Send(context.Background(), "x"); err == nil {
		t.Fatal("Send = nil")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait right after a 429 = %v, want to be held back", err)
	}
}

func TestWaitKeepsThePace(t *testing.T) {
	t.Parallel()
	c := &Client{Rate: 20}
	began := time.Now()
	for range 5 {
		if err := c.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// The first is free, the next four 50ms apart; loosely.
	if d := time.Since(began); d < 150*time.Millisecond {
		t.Errorf("5 messages at 20/s in %v", d)
	}
	if c.Interval() != 50*time.Millisecond {
		t.Errorf("Interval = %v", c.Interval())
	}
}

func TestNetworkErrorHidesToken(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := &Client{BaseURL: url, Token: token, ChatID: "1", HTTP: &http.Client{Timeout: time.Second}}
	err := c.Send(context.Background(), "x")
	if err == nil || strings.Contains(err.Error(), "SECRET") || errors.Is(err, ErrRejected) {
		t.Errorf("Send to a closed port = %v", err)
	}
}

func TestEscapeAndLen(t *testing.T) {
	t.Parallel()
	if got, want := Escape(`<a href="x">Привет & 🚀</a>`), `&lt;a href="x"&gt;Привет &amp; 🚀&lt;/a&gt;`; got != want {
		t.Errorf("Escape = %q, want %q", got, want)
	}
	for s, want := range map[string]int{"abc": 3, "Привет": 6, "🚀": 2, "a🚀b": 4, "…": 1} {
		if got := Len(s); got != want {
			t.Errorf("Len(%q) = %d, want %d", s, got, want)
		}
	}
}
