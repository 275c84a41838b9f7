package testkit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TelegramMessage is one sendMessage request the fake Telegram received.
type TelegramMessage struct {
	Chat      string
	Thread    int
	ParseMode string
	Text      string
	At        time.Time
}

// Answers as the Bot API gives them, for Telegram.SetAnswer.
const (
	Answer429 = `{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 1","parameters":{"retry_after":1}}`
	Answer500 = `{"ok":false,"error_code":500,"description":"Internal Server Error"}`
	Answer401 = `{"ok":false,"error_code":401,"description":"Unauthorized"}`
	Answer400 = `{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}`
)

// Telegram is a fake Telegram Bot API: POST /bot<Token>/sendMessage, with
// the Bot API's answers. By default every message is accepted; SetAnswer
// picks the answer per request.
type Telegram struct {
	*httptest.Server
	// Token is the only bot token the fake knows.
	Token string

	mu       sync.Mutex
	answer   func(n int) (code int, body string)
	onAccept func(TelegramMessage)
	received []TelegramMessage
	accepted []TelegramMessage
}

// NewTelegram starts a fake Telegram for bot token; it stops with the
// test.
func NewTelegram(t testing.TB, token string) *Telegram {
	f := &Telegram{Token: token}
	f.Server = httptest.NewServer(f)
	t.Cleanup(f.Close)
	return f
}

// ServeHTTP answers sendMessage as the Bot API does.
func (f *Telegram) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/bot"+f.Token+"/sendMessage" {
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"ok":false,"error_code":404,"description":"Not Found"}`)
		return
	}
	var body struct {
		ChatID    json.RawMessage `json:"chat_id"`
		Text      string          `json:"text"`
		ParseMode string          `json:"parse_mode"`
		Thread    int             `json:"message_thread_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Text == "" {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"ok":false,"error_code":400,"description":"Bad Request: message text is empty"}`)
		return
	}
	m := TelegramMessage{Chat: strings.Trim(string(body.ChatID), `"`), Thread: body.Thread, ParseMode: body.ParseMode, Text: body.Text, At: time.Now()}
	f.mu.Lock()
	f.received = append(f.received, m)
	n := len(f.received)
	code, ans := http.StatusOK, ""
	if f.answer != nil {
		code, ans = f.answer(n)
	}
	var accepted bool
	if code == http.StatusOK {
		f.accepted = append(f.accepted, m)
		accepted = true
		ans = fmt.Sprintf(`{"ok":true,"result":{"message_id":%d,"date":%d,"chat":{"id":%s},"text":"..."}}`, n, time.Now().Unix(), m.Chat)
	}
	onAccept := f.onAccept
	f.mu.Unlock()
	if accepted && onAccept != nil {
		onAccept(m) // Telegram holds the message; the bot has no answer yet
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, ans)
}

// Messages returns the messages accepted so far, in order.
func (f *Telegram) Messages() []TelegramMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]TelegramMessage(nil), f.accepted...)
}

// Received returns every well-formed request so far, accepted or not.
func (f *Telegram) Received() []TelegramMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]TelegramMessage(nil), f.received...)
}

// Requests is the number of well-formed requests so far.
func (f *Telegram) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.received)
}

// SetOnAccept calls h with each accepted message before it is answered.
func (f *Telegram) SetOnAccept(h func(TelegramMessage)) {
	f.mu.Lock()
	f.onAccept = h
	f.mu.Unlock()
}

// SetAnswer makes a pick the status code and body of the nth request
// (from 1); a 200 is always answered with the accepted message.
func (f *Telegram) SetAnswer(a func(n int) (code int, body string)) {
	f.mu.Lock()
	f.answer = a
	f.mu.Unlock()
}
