// Package logstream carries an agent's output to the stream JOBS_LOGS
// while the agent runs, in the format of package joblog, and renders
// Claude Code's stream-json into readable lines on the way (render.go).
//
// The runner drains the agent's output pipe and writes each chunk to a
// Publisher (see agent.Spec.Output). Write never waits on the network: it
// batches the output in memory, and a goroutine of the Publisher
// publishes the batches, so a slow or absent JetStream only delays what
// is published and never holds the agent up. What must hold:
//
//   - Output is published in order, in batches: a batch is sealed when it
//     holds BatchBytes or when its first line is FlushInterval old, so a
//     chatty agent costs few messages and a quiet one is seen within
//     about FlushInterval.
//   - No message exceeds the server's max payload: long lines are cut
//     across messages, and readers join the bodies.
//   - Output waiting for JetStream is bounded by BufferBytes. What comes
//     while the buffer is full is skipped whole lines at a time and
//     counted, and a line in the log itself says how much was dropped,
//     where it was dropped. The local log file keeps everything.
//   - Every message carries a Nats-Msg-Id unique to the attempt and the
//     batch, so a publish retried after a lost ack is stored once.
//   - The last message is joblog.KindEnd, carrying the end of the
//     readable view, unless JetStream stayed away until Close gave up.
package logstream

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
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
	BufferBytesDefault    = 8 << 20
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

// Config says whose output a Publisher carries and where it publishes.
type Config struct {
	JS      jetstream.JetStream
	Log     *zap.Logger
	JobID   string
	Attempt int
	// MaxPayload is the server's max payload (nats.Conn.MaxPayload).
	// Default MaxPayloadDefault.
	MaxPayload int64
	// BatchBytes seals a batch once it holds this much output. Default
	// BatchBytesDefault; never more than the max payload allows.
	BatchBytes int
	// FlushInterval seals a batch this long after its first line.
	// Default FlushIntervalDefault.
	FlushInterval time.Duration
	// BufferBytes bounds the output waiting for JetStream. Default
	// BufferBytesDefault.
	BufferBytes int
	// PublishTimeout bounds one publish. Default PublishTimeoutDefault.
	PublishTimeout time.Duration
}

// Stats say what became of the output once a Publisher is closed.
type Stats struct {
	// Bytes is the output written to the Publisher.
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

// Publisher carries one attempt's output to JOBS_LOGS. Start it before
// the agent, write the agent's output to it, Close it once the agent has
// ended.
type Publisher struct {
	cfg     Config
	subject string
	wake    chan struct{} // a message is pending
	ending  chan struct{}
	done    chan struct{}
	stop    context.CancelFunc
	ctx     context.Context

	// mu guards the output's way from Write to the messages that wait
	// for JetStream: Write batches under it, the run goroutine takes the
	// messages under it and publishes them without it.
	mu         sync.Mutex
	progress   Progress
	activity   time.Time
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
	notedBytes int64
	notedLines int64

	// Owned by the run goroutine.
	retryAt time.Time
	failing bool
}

type outMsg struct {
	kind string
	data []byte
	id   string
}

// Start starts a Publisher's goroutine, which publishes what is written
// to it.
func Start(cfg Config) *Publisher {
	cfg.MaxPayload = cmp.Or(cfg.MaxPayload, MaxPayloadDefault)
	cfg.BatchBytes = min(cmp.Or(cfg.BatchBytes, BatchBytesDefault), int(cfg.MaxPayload)-headerRoom)
	cfg.FlushInterval = cmp.Or(cfg.FlushInterval, FlushIntervalDefault)
	cfg.BufferBytes = cmp.Or(cfg.BufferBytes, BufferBytesDefault)
	cfg.PublishTimeout = cmp.Or(cfg.PublishTimeout, PublishTimeoutDefault)
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Publisher{
		cfg: cfg, subject: proto.LogSubject(cfg.JobID, cfg.Attempt),
		wake: make(chan struct{}, 1), ending: make(chan struct{}), done: make(chan struct{}), ctx: ctx, stop: stop,
		r: NewRenderer(),
	}
	go p.run()
	return p
}

// Progress returns what the output said so far, and when the agent last
// printed (zero before its first output).
func (p *Publisher) Progress() (Progress, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.progress, p.activity
}

// Write takes a chunk of the agent's output. It never waits on
// JetStream: the output joins the open batch, or is dropped while the
// buffer is full. It always returns len(b), nil.
func (p *Publisher) Write(b []byte) (int, error) {
	p.mu.Lock()
	p.consume(b)
	ready := len(p.pending) > 0
	p.mu.Unlock()
	if ready {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return len(b), nil
}

// Close publishes the rest of the output and the end message, and
// returns what became of the output. It gives up when ctx ends. Nothing
// may be written to p once Close is called.
func (p *Publisher) Close(ctx context.Context) Stats {
	close(p.ending)
	select {
	case <-p.done:
	case <-ctx.Done():
		p.stop()
		<-p.done
	}
	p.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// run publishes the pending messages as they come, and seals a batch
// once its first line is FlushInterval old.
func (p *Publisher) run() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.FlushInterval / 4)
	defer tick.Stop()
	for {
		p.mu.Lock()
		if len(p.raw) > 0 && time.Since(p.batchStart) >= p.cfg.FlushInterval {
			p.seal()
		}
		p.mu.Unlock()
		p.publish()
		select {
		case <-p.ctx.Done():
			return
		case <-p.ending:
			p.finish()
			return
		case <-p.wake:
		case <-tick.C:
		}
	}
}

// consume splits a chunk of output into lines and adds them to the batch.
// p.mu is held.
func (p *Publisher) consume(chunk []byte) {
	p.stats.Bytes += int64(len(chunk))
	p.activity = time.Now()
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
	p.progress = p.r.Progress()
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
