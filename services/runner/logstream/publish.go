package logstream

import (
	"context"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
)

// seal closes the open batch: its readable and raw forms become messages,
// one message for both when they are the same bytes.
func (p *Publisher) seal() {
	if len(p.raw) == 0 && len(p.text) == 0 {
		return
	}
	if p.differs {
		p.keepTail(p.text)
		p.enqueue(joblog.KindText, p.text)
		p.enqueue(joblog.KindRaw, p.raw)
	} else {
		p.keepTail(p.raw)
		p.enqueue(joblog.KindBoth, p.raw)
	}
	p.text, p.raw, p.differs = p.text[:0], p.raw[:0], false
}

// enqueue queues data as messages of kind, cut to the max payload; the
// readable view is cut between UTF-8 characters only.
func (p *Publisher) enqueue(kind string, data []byte) {
	limit := int(p.cfg.MaxPayload) - headerRoom
	for len(data) > 0 {
		n := min(len(data), limit)
		if kind != joblog.KindRaw && n < len(data) {
			for n > 1 && !utf8.RuneStart(data[n]) {
				n--
			}
		}
		p.seq++
		p.pending = append(p.pending, outMsg{kind: kind, data: append([]byte(nil), data[:n]...), id: p.msgID()})
		p.pendingLen += n
		data = data[n:]
	}
}

func (p *Publisher) msgID() string {
	return p.subject + "." + strconv.Itoa(p.seq)
}

// keepTail keeps the last TailBytes of the readable view for the end
// message.
func (p *Publisher) keepTail(text []byte) {
	p.tail = append(p.tail, text...)
	if over := len(p.tail) - TailBytes; over > TailBytes {
		p.tail = append(p.tail[:0], p.tail[over:]...)
	}
}

// publish sends the queued messages in order until one fails; after a
// failure it waits a moment before it tries again, reading on meanwhile.
func (p *Publisher) publish() {
	if time.Now().Before(p.retryAt) {
		return
	}
	for len(p.pending) > 0 {
		m := p.pending[0]
		if err := p.send(m); err != nil {
			if !p.failing {
				p.cfg.Log.Warn("publishing agent output: will retry, buffering meanwhile", zap.String("subject", p.subject), zap.Error(err))
			}
			p.failing = true
			p.retryAt = time.Now().Add(500 * time.Millisecond)
			return
		}
		if p.failing {
			p.cfg.Log.Info("publishing agent output again", zap.String("subject", p.subject))
			p.failing = false
		}
		p.pending[0] = outMsg{}
		p.pending = p.pending[1:]
		p.pendingLen -= len(m.data)
		if len(p.pending) == 0 && !p.skipping && p.stats.DroppedBytes > p.notedBytes {
			// There is room again: say what was dropped now, not only
			// when the agent prints its next line.
			p.dropNote()
		}
	}
}

func (p *Publisher) send(m outMsg) error {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.PublishTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: p.subject, Data: m.data, Header: nats.Header{}}
	msg.Header.Set(joblog.HeaderKind, m.kind)
	msg.Header.Set(proto.HeaderMsgID, m.id)
	if _, err := p.cfg.JS.PublishMsg(ctx, msg); err != nil {
		return err
	}
	p.stats.Messages++
	return nil
}

// finish publishes the rest once the agent has ended: the line it left
// unended, a note of drops not yet noted, the last batch and the end
// message with the tail of the readable view. It tries until the
// Publisher's context ends (Close gave up).
func (p *Publisher) finish() {
	if len(p.partial) > 0 {
		p.addLine(p.partial, false)
		p.partial = p.partial[:0]
	}
	p.dropNote()
	p.seal()
	p.seq++
	p.pending = append(p.pending, outMsg{kind: joblog.KindEnd, data: append([]byte(nil), joblog.TrimToLines(p.tail, TailBytes)...), id: p.msgID()})
	for {
		p.retryAt = time.Time{}
		p.publish()
		if len(p.pending) == 0 {
			break
		}
		if !backoff.Sleep(p.ctx, 250*time.Millisecond) {
			p.stats.Unpublished = p.pendingLen
			p.cfg.Log.Warn("agent output not published: JetStream unreachable until the attempt's deadline",
				zap.String("subject", p.subject), zap.Int("bytes", p.pendingLen))
			return
		}
	}
	p.stats.Ended = true
}
