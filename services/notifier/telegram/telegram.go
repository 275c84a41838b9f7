// Package telegram is a small client of the Telegram Bot API's sendMessage,
// with the answers that matter told apart: a 429 says how long to wait, a
// 400/401/403/404 will not get better by retrying, anything else might. It
// keeps to Telegram's pace of about one message a second per chat.
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
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/orch-dev/orch/kit/backoff"
)

// MaxMessageLen is the most characters sendMessage takes. Telegram counts
// UTF-16 code units of the text; see Len.
const MaxMessageLen = 4096

// TimeoutDefault bounds one sendMessage request.
const TimeoutDefault = 15 * time.Second

// Client sends messages to one chat. Its zero value is not usable: set
// BaseURL, Token, ChatID and Rate; the notifier's configuration has their
// defaults, so this package has none. A Client is safe for concurrent use.
type Client struct {
	// BaseURL of the Bot API, such as https://api.telegram.org.
	BaseURL string
	// Token is the bot's token. It is part of the request URL, so no
	// error of this package includes the URL.
	Token string
	// ChatID is the chat (a number, or @channelname).
	ChatID string
	// ThreadID is the forum topic, if any.
	ThreadID int
	// Rate is the most messages a second Wait lets through; it must be
	// above 0 (Telegram asks bots for about 1 a second to one chat).
	Rate float64
	// HTTP is the client for requests; nil means one with TimeoutDefault.
	HTTP *http.Client

	once      sync.Once
	lim       *rate.Limiter
	mu        sync.Mutex
	holdUntil time.Time // set by a 429: no request before it
}

// RateLimitedError is a 429 answer: wait RetryAfter before the next try.
type RateLimitedError struct {
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("telegram: rate limited, retry after %v", e.RetryAfter)
}

// ErrRejected wraps answers that retrying will not fix: a bad token, an
// unknown chat, a bot removed from the chat, a malformed message.
var ErrRejected = errors.New("telegram rejected the message")

// answer is the envelope of every Bot API answer.
type answer struct {
	OK          bool   `json:"ok"`
	ErrorCode   int    `json:"error_code"`
	Description string `json:"description"`
	Parameters  struct {
		RetryAfter int `json:"retry_after"`
	} `json:"parameters"`
}

func (c *Client) init() {
	c.once.Do(func() {
		c.lim = rate.NewLimiter(rate.Limit(c.Rate), 1)
	})
}

// Interval is the least time between two messages to the chat; 0 for a
// Client without a Rate, which Wait refuses.
func (c *Client) Interval() time.Duration {
	if c.Rate <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / c.Rate)
}

// Wait blocks until a message may be sent: the chat's pace allows it and
// any retry_after of an earlier 429 has passed. It returns ctx's error if
// ctx ends first.
func (c *Client) Wait(ctx context.Context) error {
	if c.Rate <= 0 {
		return errors.New("telegram: the client has no rate of messages")
	}
	c.init()
	c.mu.Lock()
	hold := time.Until(c.holdUntil)
	c.mu.Unlock()
	if !backoff.Sleep(ctx, hold) {
		return ctx.Err()
	}
	return c.lim.Wait(ctx)
}

// Send sends an HTML message. It does not wait for the pace: call Wait
// first. A 429 answer returns a *RateLimitedError and holds back later
// Waits for its retry_after; a 400, 401, 403 or 404 returns an error
// wrapping ErrRejected.
func (c *Client) Send(ctx context.Context, html string) error {
	c.init()
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
		return fmt.Errorf("telegram: encoding message: %w", err)
	}
	if c.BaseURL == "" {
		return errors.New("telegram: the client has no Bot API URL")
	}
	url := strings.TrimRight(c.BaseURL, "/") + "/bot" + c.Token + "/sendMessage"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return errors.New("telegram: building request") // err would show the URL
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: TimeoutDefault}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("telegram: %w", c.redact(err))
	}
	defer resp.Body.Close()
	var a answer
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&a)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // reuse the connection
	desc := c.redactString(a.Description)
	switch code := resp.StatusCode; {
	case code == http.StatusOK && a.OK:
		return nil
	case code == http.StatusTooManyRequests || a.ErrorCode == http.StatusTooManyRequests:
		wait := time.Duration(max(a.Parameters.RetryAfter, 1)) * time.Second
		c.mu.Lock()
		c.holdUntil = time.Now().Add(wait)
		c.mu.Unlock()
		return &RateLimitedError{RetryAfter: wait}
	case code == http.StatusBadRequest, code == http.StatusUnauthorized,
		code == http.StatusForbidden, code == http.StatusNotFound:
		return fmt.Errorf("%w: %d %s", ErrRejected, code, desc)
	default:
		return fmt.Errorf("telegram: %d %s", code, desc)
	}
}

// redact unwraps a *url.Error, whose text holds the URL and so the token,
// and removes the token from what is left.
func (c *Client) redact(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && strings.Contains(err.Error(), "/bot") {
		if inner := ue.Unwrap(); inner != nil {
			err = inner
		}
	}
	if c.Token != "" && strings.Contains(err.Error(), c.Token) {
		return errors.New(c.redactString(err.Error()))
	}
	return err
}

func (c *Client) redactString(s string) string {
	if c.Token == "" {
		return s
	}
	return strings.ReplaceAll(s, c.Token, "<token>")
}

// Escape makes s safe inside an HTML-mode message: Telegram needs only
// <, > and & escaped.
func Escape(s string) string {
	return htmlEscaper.Replace(s)
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// Len is the length of s as Telegram counts it: UTF-16 code units, so an
// emoji outside the Basic Multilingual Plane counts two.
func Len(s string) int {
	n := 0
	for _, r := range s {
		if r >= 0x10000 {
			n += 2
		} else {
			n++
		}
	}
	return n
}
