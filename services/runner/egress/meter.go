package egress

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Usage is what one job's model requests used, as metered from the
// answers passing the proxy.
type Usage struct {
	// Requests counts the requests forwarded to the model API, whatever
	// their answer.
	Requests int64
	// Token counts from the answers' usage, summed.
	InputTokens              int64
	OutputTokens             int64
	CacheCreationInputTokens int64
	CacheReadInputTokens     int64
	// CostUSD prices those tokens by the price table.
	CostUSD float64
	// Unpriced counts answers whose model the price table does not name
	// (their tokens are counted, their cost is not); UnpricedModels names
	// those models.
	Unpriced       int64
	UnpricedModels []string
	// RateLimited counts 429 answers; RetryAfter is the last one's
	// retry-after (0 when it had none) and RateLimitedAt when it came.
	RateLimited   int64
	RetryAfter    time.Duration
	RateLimitedAt time.Time
}

// tokens is one answer's usage.
type tokens struct {
	input, output, cacheCreation, cacheRead int64
	// split says the answer broke its cache writes down by lifetime
	// (cache_creation.ephemeral_5m/1h_input_tokens).
	split            bool
	cache5m, cache1h int64
}

// apiUsage is the API's usage object; a field left out is nil, so a
// message_delta overrides only what it carries.
type apiUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreation            *struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
}

// merge lays u over t: the API's counts are cumulative, so a later event's
// value replaces an earlier one.
func (t *tokens) merge(u *apiUsage) {
	if u == nil {
		return
	}
	set := func(dst *int64, v *int64) {
		if v != nil {
			*dst = *v
		}
	}
	set(&t.input, u.InputTokens)
	set(&t.output, u.OutputTokens)
	set(&t.cacheCreation, u.CacheCreationInputTokens)
	set(&t.cacheRead, u.CacheReadInputTokens)
	if u.CacheCreation != nil {
		t.split = true
		t.cache5m, t.cache1h = u.CacheCreation.Ephemeral5m, u.CacheCreation.Ephemeral1h
	}
}

// meter sums the usage of a job's answers.
type meter struct {
	mu sync.Mutex
	u  Usage
}

func (m *meter) request() {
	m.mu.Lock()
	m.u.Requests++
	m.mu.Unlock()
}

func (m *meter) rateLimited(after time.Duration, at time.Time) {
	m.mu.Lock()
	m.u.RateLimited++
	m.u.RetryAfter, m.u.RateLimitedAt = after, at
	m.mu.Unlock()
}

// add records one answer's usage, priced from prices.
func (m *meter) add(model string, t tokens, prices map[string]Price) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.u.InputTokens += t.input
	m.u.OutputTokens += t.output
	m.u.CacheCreationInputTokens += t.cacheCreation
	m.u.CacheReadInputTokens += t.cacheRead
	if p, ok := prices[priceKey(model)]; ok {
		m.u.CostUSD += p.cost(t)
		return
	}
	m.u.Unpriced++
	if !slices.Contains(m.u.UnpricedModels, model) && len(m.u.UnpricedModels) < 16 {
		m.u.UnpricedModels = append(m.u.UnpricedModels, model)
	}
}

// Usage returns what the job's model requests used so far.
func (p *Proxy) Usage() Usage {
	p.meter.mu.Lock()
	defer p.meter.mu.Unlock()
	u := p.meter.u
	u.UnpricedModels = slices.Clone(u.UnpricedModels)
	return u
}

// retryAfter reads a retry-after header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// maxEventLine bounds the part of one server-sent event line kept for
// parsing: message_start and message_delta lines are a few hundred bytes,
// and longer lines (content deltas) are not read.
const maxEventLine = 64 << 10

// sseMeter passes a streamed answer through untouched, reading the usage
// from its message_start and message_delta events as the bytes go by.
type sseMeter struct {
	body  io.ReadCloser
	done  func(model string, t tokens)
	line  []byte
	long  bool   // the current line passed maxEventLine
	name  string // the current event's name, from its "event:" line
	model string
	t     tokens
	seen  bool
	once  sync.Once
}

func (s *sseMeter) Read(b []byte) (int, error) {
	n, err := s.body.Read(b)
	s.feed(b[:n])
	if err == io.EOF {
		s.finish()
	}
	return n, err
}

func (s *sseMeter) Close() error {
	s.finish()
	return s.body.Close()
}

func (s *sseMeter) finish() {
	s.once.Do(func() {
		if s.seen {
			s.done(s.model, s.t)
		}
	})
}

// feed splits chunk into lines, carrying a partial line to the next call.
func (s *sseMeter) feed(chunk []byte) {
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		part := chunk
		if i >= 0 {
			part = chunk[:i]
		}
		if !s.long {
			if len(s.line)+len(part) > maxEventLine {
				s.long, s.line = true, s.line[:0]
			} else {
				s.line = append(s.line, part...)
			}
		}
		if i < 0 {
			return
		}
		if !s.long {
			s.event(bytes.TrimSuffix(s.line, []byte("\r")))
		}
		s.line, s.long = s.line[:0], false
		chunk = chunk[i+1:]
	}
}

// event reads one line of the stream: only the data of the two events
// that carry usage is decoded, told by the event's "event:" line or, in a
// stream without them, by the type named in the data (anywhere: JSON
// keys come in any order).
func (s *sseMeter) event(line []byte) {
	if len(line) == 0 {
		s.name = ""
		return
	}
	if name, ok := bytes.CutPrefix(line, []byte("event:")); ok {
		s.name = string(bytes.TrimSpace(name))
		return
	}
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	switch s.name {
	case "message_start", "message_delta":
	case "":
		if !bytes.Contains(data, []byte(`"message_start"`)) && !bytes.Contains(data, []byte(`"message_delta"`)) {
			return
		}
	default:
		return
	}
	var ev struct {
		Type    string `json:"type"`
		Message struct {
			Model string    `json:"model"`
			Usage *apiUsage `json:"usage"`
		} `json:"message"`
		Usage *apiUsage `json:"usage"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	switch ev.Type {
	case "message_start":
		s.seen = true
		s.model = ev.Message.Model
		s.t.merge(ev.Message.Usage)
	case "message_delta":
		s.seen = true
		s.t.merge(ev.Usage)
	}
}

// maxJSONAnswer bounds the non-streamed answer kept for reading its
// usage; a longer one passes unmetered.
const maxJSONAnswer = 16 << 20

// jsonMeter passes a non-streamed answer through, keeping a copy to read
// its model and usage at the end.
type jsonMeter struct {
	body io.ReadCloser
	done func(model string, t tokens)
	buf  bytes.Buffer
	over bool
	once sync.Once
}

func (j *jsonMeter) Read(b []byte) (int, error) {
	n, err := j.body.Read(b)
	if !j.over {
		if j.buf.Len()+n > maxJSONAnswer {
			j.over = true
			j.buf = bytes.Buffer{}
		} else {
			j.buf.Write(b[:n])
		}
	}
	if err == io.EOF {
		j.once.Do(j.finish)
	}
	return n, err
}

func (j *jsonMeter) Close() error {
	j.once.Do(func() {})
	return j.body.Close()
}

func (j *jsonMeter) finish() {
	if j.over {
		return
	}
	var msg struct {
		Model string    `json:"model"`
		Usage *apiUsage `json:"usage"`
	}
	if json.Unmarshal(j.buf.Bytes(), &msg) != nil || msg.Usage == nil {
		return
	}
	var t tokens
	t.merge(msg.Usage)
	j.done(msg.Model, t)
}
