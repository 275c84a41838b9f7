// Package logstream carries an agent's output to the stream JOBS_LOGS
// while the agent runs, in the format of package joblog, and renders
// Claude Code's stream-json into readable lines on the way (render.go).
//
// The runner drains the agent's output pipe into the attempt's log file
// (see agent.Spec.Drained); a Publisher follows that file, woken by Wake
// after each write, and polling besides. So the agent never waits on the
// network, and the file is the buffer: a slow JetStream only delays what
// is published, and an absent one loses only what passes BufferBytes
// meanwhile, in the stream, never in the file. What must hold:
//
//   - Output is published in order, in batches: a batch is sealed when it
//     holds BatchBytes or when its first line is FlushInterval old, so a
//     chatty agent costs few messages and a quiet one is seen within
//     about FlushInterval (plus PollInterval when nothing calls Wake).
//   - No message exceeds the server's max payload: long lines are cut
//     across messages, and readers join the bodies.
//   - Output waiting for JetStream is bounded by BufferBytes. What comes
//     while the buffer is full is skipped whole lines at a time and
//     counted, and a line in the log itself says how much was dropped,
//     where it was dropped. The file keeps everything.
//   - Every message carries a Nats-Msg-Id unique to the attempt and the
//     batch, so a publish retried after a lost ack is stored once.
//   - The last message is joblog.KindEnd, carrying the end of the
//     readable view, unless JetStream stayed away until Close gave up.
package logstream

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
)

// Defaults of a Publisher's Config.
const (
	BatchBytesDefault     = 128 << 10
	FlushIntervalDefault  = 300 * time.Millisecond
	PollIntervalDefault   = 100 * time.Millisecond
	PublishTimeoutDefault = 2 * time.Second
	// MaxPayloadDefault is nats-server's default max payload, used when
	// the connection does not say.
	MaxPayloadDefault = 1 << 20
	// TailBytes is how much of the readable view the end message repeats.
	TailBytes = 8 << 10
	// headerRoom is kept free of a message's max payload for its headers
	// and subject.
	headerRoom = 1 << 10
)

// Config says what a Publisher follows and where it publishes.
type Config struct {
	JS      jetstream.JetStream
	Log     *zap.Logger
	JobID   string
	Attempt int
	// Path is the agent's log file. It need not exist yet.
	Path string
	// MaxPayload is the server's max payload (nats.Conn.MaxPayload).
	// Default MaxPayloadDefault.
	MaxPayload int64
	// BatchBytes seals a batch once it holds this much output. Default
	// BatchBytesDefault; never more than the max payload allows.
	BatchBytes int
	// FlushInterval seals a batch this long after its first line.
	// Default FlushIntervalDefault.
	FlushInterval time.Duration
	// PollInterval is how often the file is checked for output when Wake
	// is not called. Default PollIntervalDefault.
	PollInterval time.Duration
	// BufferBytes bounds the output waiting for JetStream; it must be
	// above 0 (the runner's ORCH_LOG_BUFFER, whose default is its
	// configuration's).
	BufferBytes int
	// PublishTimeout bounds one publish. Default PublishTimeoutDefault.
	PublishTimeout time.Duration
	// Price prices an assistant message's usage, for Progress.SpentUSD;
	// nil estimates nothing.
	Price func(model string, u Usage) float64
}

// Stats say what became of the output once a Publisher is closed.
type Stats struct {
	// Bytes is the output read from the file.
	Bytes int64
	// Messages is how many messages were published.
	Messages int
	// DroppedBytes and DroppedLines were skipped while the buffer was full.
	DroppedBytes int64
	DroppedLines int64
	// Unpublished is the output still waiting when Close gave up.
	Unpublished int
	// Ended reports whether the end message was published.
	Ended bool
}

// Publisher follows one attempt's log file and publishes it. Start it
// before the agent, Close it once the agent has ended.
type Publisher struct {
	cfg     Config
	subject string
	wake    chan struct{}
	ending  chan struct{}
	done    chan struct{}
	stop    context.CancelFunc
	ctx     context.Context

	mu       sync.Mutex // guards progress and activity
	progress Progress
	activity time.Time

	// Owned by the run goroutine; Close reads stats once it has ended.
	stats      Stats
	r          *Renderer
	partial    []byte // a line not yet ended
	cont       bool   // partial continues a line cut earlier
	skipping   bool   // dropping: skip to the next line break
	text, raw  []byte // the open batch; text only once differs
	differs    bool   // the readable form is not raw
	line       []byte // scratch: one line's readable form
	batchStart time.Time
	pending    []outMsg
	pendingLen int
	seq        int
	tail       []byte
	retryAt    time.Time
	failing    bool
	notedBytes int64
	notedLines int64
}

type outMsg struct {
	kind string
	data []byte
	id   string
}

// Start starts following cfg.Path. It refuses a Config without a buffer.
func Start(cfg Config) (*Publisher, error) {
	if cfg.BufferBytes < 1 {
		return nil, fmt.Errorf("logstream: a buffer of %d bytes holds no output", cfg.BufferBytes)
	}
	cfg.MaxPayload = cmp.Or(cfg.MaxPayload, MaxPayloadDefault)
	cfg.BatchBytes = min(cmp.Or(cfg.BatchBytes, BatchBytesDefault), int(cfg.MaxPayload)-headerRoom)
	cfg.FlushInterval = cmp.Or(cfg.FlushInterval, FlushIntervalDefault)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, PollIntervalDefault)
	cfg.PublishTimeout = cmp.Or(cfg.PublishTimeout, PublishTimeoutDefault)
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Publisher{
		cfg: cfg, subject: proto.LogSubject(cfg.JobID, cfg.Attempt),
		wake: make(chan struct{}, 1), ending: make(chan struct{}), done: make(chan struct{}), ctx: ctx, stop: stop,
		r: NewPricedRenderer(cfg.Price),
	}
	go p.run()
	return p, nil
}

// Progress returns what the output said so far, and when the agent last
// printed (zero before its first output).
func (p *Publisher) Progress() (Progress, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.progress, p.activity
}

// Wake tells p that the file has grown, so that it reads it at once
// rather than at its next poll. It never blocks.
func (p *Publisher) Wake() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close reads the rest of the file, publishes it and the end message,
// and returns what became of the output. It gives up when ctx ends.
func (p *Publisher) Close(ctx context.Context) Stats {
	close(p.ending)
	select {
	case <-p.done:
	case <-ctx.Done():
		p.stop()
		<-p.done
	}
	p.stop()
	// The run goroutine, which owns stats, has ended.
	return p.stats
}

func (p *Publisher) run() {
	defer close(p.done)
	var f *os.File
	defer func() {
		if f != nil {
			_ = f.Close()
		}
	}()
	buf := make([]byte, 64<<10)
	tick := time.NewTicker(p.cfg.PollInterval)
	defer tick.Stop()
	ending := false
	for {
		if f == nil {
			if fh, err := os.Open(p.cfg.Path); err == nil {
				f = fh
			}
		}
		// Read all there is, publishing as batches fill.
		for f != nil {
			n, err := f.Read(buf)
			if n > 0 {
				p.consume(buf[:n])
				p.publish()
			}
			if n == 0 || err != nil {
				if err != nil && !errors.Is(err, io.EOF) {
					p.cfg.Log.Warn("reading agent log", zap.Error(err))
				}
				break
			}
		}
		if ending {
			p.finish()
			return
		}
		if len(p.raw) > 0 && time.Since(p.batchStart) >= p.cfg.FlushInterval {
			p.seal()
		}
		p.publish()
		select {
		case <-p.ctx.Done():
			return
		case <-p.ending:
			// One more read to the end of the file, then finish.
			ending = true
		case <-p.wake:
		case <-tick.C:
		}
	}
}

// consume splits a chunk of output into lines and adds them to the batch.
func (p *Publisher) consume(chunk []byte) {
	p.stats.Bytes += int64(len(chunk))
	p.mu.Lock()
	p.activity = time.Now()
	p.mu.Unlock()
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			p.partial = append(p.partial, chunk...)
			if len(p.partial) >= p.cfg.BatchBytes {
				p.cutLong()
			}
			break
		}
		line := chunk[:i]
		if len(p.partial) > 0 {
			p.partial = append(p.partial, line...)
			line = p.partial
		}
		p.addLine(line, true)
		p.partial, p.cont = p.partial[:0], false
		chunk = chunk[i+1:]
	}
	prog := p.r.Progress()
	p.mu.Lock()
	p.progress = prog
	p.mu.Unlock()
}

// cutLong publishes the start of a line too long for one message, kept
// to whole UTF-8 characters so its readable form needs no escapes.
func (p *Publisher) cutLong() {
	n := len(p.partial)
	for i := n - 1; i >= 0 && i >= n-utf8.UTFMax; i-- {
		if utf8.RuneStart(p.partial[i]) {
			if !utf8.FullRune(p.partial[i:]) {
				n = i
			}
			break
		}
	}
	if n == 0 {
		n = len(p.partial)
	}
	p.addLine(p.partial[:n], false)
	rest := copy(p.partial, p.partial[n:])
	p.partial, p.cont = p.partial[:rest], true
}

// addLine adds a line (ended: it had a line break) to the open batch, or
// drops it while the buffer is full.
func (p *Publisher) addLine(line []byte, ended bool) {
	size := len(line) + 1
	if p.skipping || p.pendingLen+len(p.raw)+size > p.cfg.BufferBytes {
		p.stats.DroppedBytes += int64(size)
		if ended {
			p.stats.DroppedLines++
		}
		// Drop to the end of the line, so kept lines stay whole.
		p.skipping = !ended
		return
	}
	p.dropNote()
	if len(p.raw) == 0 {
		p.batchStart = time.Now()
	}
	rawStart := len(p.raw)
	p.raw = append(p.raw, line...)
	if ended {
		p.raw = append(p.raw, '\n')
	}
	// While the batch's readable form is its raw bytes, p.text is not
	// kept: most output is plain text, and a second copy of it costs the
	// runner as much as everything else it does with the output.
	render := ended && !p.cont
	if !p.differs && utf8.Valid(line) && (!render || !IsEvent(line)) {
		p.sealIfFull()
		return
	}
	readable := p.line[:0]
	if render {
		readable = p.r.Line(readable, line)
	} else {
		readable = AppendEscaped(readable, line)
		if ended {
			readable = append(readable, '\n')
		}
	}
	p.line = readable
	switch {
	case p.differs:
		p.text = append(p.text, readable...)
	case !bytes.Equal(readable, p.raw[rawStart:]):
		p.text = append(append(p.text[:0], p.raw[:rawStart]...), readable...)
		p.differs = true
	}
	p.sealIfFull()
}

// sealIfFull seals the batch once it holds BatchBytes.
func (p *Publisher) sealIfFull() {
	if len(p.raw) >= p.cfg.BatchBytes || len(p.text) >= p.cfg.BatchBytes {
		p.seal()
	}
}

// dropNote, once output was dropped and there is room again, seals the
// batch and adds a line saying what was dropped, before any later output.
func (p *Publisher) dropNote() {
	db, dl := p.stats.DroppedBytes, p.stats.DroppedLines
	if db == p.notedBytes {
		return
	}
	p.seal()
	note := fmt.Sprintf("orch: %d bytes (%d lines) of output dropped here: JetStream could not take them and the runner's buffer of %d bytes was full\n",
		db-p.notedBytes, dl-p.notedLines, p.cfg.BufferBytes)
	p.notedBytes, p.notedLines = db, dl
	p.enqueue(joblog.KindBoth, []byte(note))
}
