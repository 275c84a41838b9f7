package writeback

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// TimeoutDefault bounds one request to Gitea or Plane.
const TimeoutDefault = 15 * time.Second

// ErrGone is wrapped by an APIError for a 404: the pull request, work item
// or comment no longer exists, and writing to it again cannot help.
var ErrGone = errors.New("not found")

// APIError is a tracker's answer other than success.
type APIError struct {
	// API is "gitea" or "plane"; Op says what was asked.
	API, Op string
	Code    int
	// Message is the tracker's own error text, cut short.
	Message string
	// RetryAfter is the wait the tracker asked for (429, 503), if any.
	RetryAfter time.Duration
	// body is the answer as sent, for callers that read an error's fields
	// (Plane's 409 names the existing comment).
	body []byte
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s: %s: HTTP %d: %s", e.API, e.Op, e.Code, e.Message)
}

// Unwrap makes a 404 match ErrGone.
func (e *APIError) Unwrap() error {
	if e.Code == http.StatusNotFound {
		return ErrGone
	}
	return nil
}

// Retryable reports an answer that may change on its own: 408, 429 and
// 5xx. Other 4xx answers (401 bad token, 403, 422) need a person.
func (e *APIError) Retryable() bool {
	return e.Code == http.StatusTooManyRequests || e.Code == http.StatusRequestTimeout || e.Code >= 500
}

// api is what both clients share: a base URL, a credential header and one
// way of sending JSON. The credential is set on the request only; it is
// never part of an error or a log line.
type api struct {
	name       string
	base       string
	authHeader string
	authValue  string
	http       *http.Client
}

// do sends in (when not nil) as JSON and decodes a 2xx answer into out
// (when not nil). Any other answer is an *APIError; a failure to reach the
// tracker is returned as it is (retryable).
func (a *api) do(ctx context.Context, op, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.base, "/")+"/api/v1"+path, body)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", a.name, op, err)
	}
	req.Header.Set(a.authHeader, a.authValue)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		// url.Error names the URL, which holds no secret: the token
		// travels in a header.
		return fmt.Errorf("%s: %s: %w", a.name, op, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s: %s: reading answer: %w", a.name, op, err)
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{API: a.name, Op: op, Code: resp.StatusCode, Message: errorText(data), RetryAfter: retryAfter(resp.Header.Get("Retry-After")), body: data}
	}
	if out == nil || len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: %s: decoding answer: %w", a.name, op, err)
	}
	return nil
}

// errorText is the message of an error answer: Gitea's "message", Plane's
// "error" or "detail", else the start of the body. Gitea answers an
// error it did not expect with an empty "message" (the cause is only in
// its own log), said as such rather than shown as JSON.
func errorText(data []byte) string {
	var m struct{ Message, Error, Detail *string }
	if json.Unmarshal(data, &m) == nil {
		for _, s := range []*string{m.Message, m.Error, m.Detail} {
			if s != nil && *s != "" {
				return cut(*s, 200)
			}
		}
		if m.Message != nil {
			return "no message (see the tracker's log)"
		}
	}
	return cut(strings.TrimSpace(string(data)), 200)
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}
