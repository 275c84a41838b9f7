// Package telegram is a small client of the Telegram Bot API's sendMessage,
// with the answers that matter told apart: a 429 says how long to wait, a
// 400/401/403 will not get better by retrying, anything else might.
package telegram

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// APIURLDefault is the Bot API's base URL.
const APIURLDefault = "https://api.telegram.org"

// MaxMessageLen is the most characters sendMessage takes.
const MaxMessageLen = 4096

// Client sends messages to one chat.
type Client struct {
	// BaseURL of the Bot API; APIURLDefault unless a test points it at a
	// fake.
	BaseURL string
	// Token is the bot's token. It is part of the request URL, so errors
	// never include the URL.
	Token  string
	ChatID string
	// ThreadID is the forum topic, if any.
	ThreadID int
	HTTP     *http.Client
}

// RateLimitedError is a 429 answer: wait RetryAfter before the next try.
type RateLimitedError struct {
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("telegram: rate limited, retry after %v", e.RetryAfter)
}

// ErrRejected wraps answers that retrying will not fix: a bad token, an
// unknown chat, a malformed message.
var ErrRejected = errors.New("telegram rejected the message")

type answer struct {
	OK          bool   `json:"ok"`
	ErrorCode   int    `json:"error_code"`
	Description string `json:"description"`
	Parameters  struct {
		RetryAfter int `json:"retry_after"`
	} `json:"parameters"`
}

// Send sends an HTML message.
func (c *Client) Send(ctx context.Context, html string) error {
	body := map[string]any{
		"chat_id":                  c.ChatID,
		"text":                     html,
		"parse_mode":               "HTML",
		"disable_web_page_preview": true,
	}
	if c.ThreadID != 0 {
		body["message_thread_id"] = c.ThreadID
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	url := strings.TrimRight(c.BaseURL, "/") + "/bot" + c.Token + "/sendMessage"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return errors.New("telegram: building request")
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 15 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		// *url.Error would print the URL, and the URL holds the token.
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) {
			err = ue.Unwrap()
		}
		return fmt.Errorf("telegram: %w", err)
	}
	defer resp.Body.Close()
	var a answer
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&a)
	switch {
	case resp.StatusCode == http.StatusOK && a.OK:
		return nil
	case resp.StatusCode == http.StatusTooManyRequests:
		return &RateLimitedError{RetryAfter: time.Duration(max(a.Parameters.RetryAfter, 1)) * time.Second}
	case resp.StatusCode == http.StatusBadRequest, resp.StatusCode == http.StatusUnauthorized,
		resp.StatusCode == http.StatusForbidden, resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %d %s", ErrRejected, resp.StatusCode, a.Description)
	}
	return fmt.Errorf("telegram: %d %s", resp.StatusCode, a.Description)
}

// Escape makes s safe inside an HTML-mode message.
func Escape(s string) string {
	return htmlEscaper.Replace(s)
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")
