package logread

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
)

// Tail returns the end of one attempt's readable output: at most maxBytes,
// from the start of a line where it can. The end message carries it when
// it is there; an attempt without one (its runner died) is read with
// ReadTail, so only the end of its output is fetched. No output gives "".
func Tail(ctx context.Context, js jetstream.JetStream, jobID string, attempt, maxBytes int) (string, error) {
	stream, err := js.Stream(ctx, proto.StreamLogs)
	if err != nil {
		return "", fmt.Errorf("opening stream %s: %w", proto.StreamLogs, err)
	}
	last, err := stream.GetLastMsgForSubject(ctx, proto.LogSubject(jobID, attempt))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the log tail: %w", err)
	}
	if last.Header.Get(joblog.HeaderKind) == joblog.KindEnd {
		return string(joblog.TrimToLines(last.Data, maxBytes)), nil
	}
	// A byte more than is kept, so that the tail can start after a
	// line break.
	t, err := ReadTail(ctx, js, jobID, attempt, false, maxBytes+1)
	if err != nil {
		return "", err
	}
	return string(joblog.TrimToLines(t.Data, maxBytes)), nil
}

// TailOf is the end of one view of an attempt's output, as ReadTail found
// it.
type TailOf struct {
	// Data is the view's last bytes, at most the maxBytes asked for,
	// starting at the start of a UTF-8 sequence.
	Data []byte
	// Cut says the view holds more output before Data.
	Cut bool
	// Found says the attempt has any message in the stream.
	Found bool
	// Messages is how many messages the read fetched from the stream: its
	// cost, which follows maxBytes, not the length of the log.
	Messages int
}

// fetchBatch bounds one pull of a tail read.
const fetchBatch = 256

// ReadTail reads the last maxBytes of one view (raw, or the readable one)
// of an attempt's output, fetching only the messages at the end of the
// attempt's subject, so that a page showing the end of a long log costs
// about maxBytes whatever the log's length.
//
// The subject's messages are interleaved with other attempts' in
// JOBS_LOGS and their sizes vary, so it cannot know where the last
// maxBytes start. It reads back from the subject's last message in
// windows of stream sequences: each window is read forward by a consumer
// that starts at the window's first sequence and fetches just the number
// of the subject's messages the window holds (the consumer's pending
// count less those already read), and the next window is sized by what
// the last one held (bytes per message, messages per sequence) to hold
// what is still missing. The first window is sized by the stream's
// average message. A window can overshoot: the bytes before the tail are
// read through to reach it; the next window is sized better.
func ReadTail(ctx context.Context, js jetstream.JetStream, jobID string, attempt int, raw bool, maxBytes int) (TailOf, error) {
	var t TailOf
	if maxBytes <= 0 {
		return t, fmt.Errorf("reading a log tail: maxBytes is %d, want more than 0", maxBytes)
	}
	subject := proto.LogSubject(jobID, attempt)
	stream, err := js.Stream(ctx, proto.StreamLogs)
	if err != nil {
		return t, fmt.Errorf("opening stream %s: %w", proto.StreamLogs, err)
	}
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return t, nil
	}
	if err != nil {
		return t, fmt.Errorf("reading %s: %w", subject, err)
	}
	t.Found, t.Messages = true, 1
	// After the last message, so that the subject's count holds every
	// message up to it (and perhaps a few that arrived since).
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return t, fmt.Errorf("reading %s: %w", subject, err)
	}
	total, first := info.State.Subjects[subject], max(info.State.FirstSeq, 1)

	var parts [][]byte // in stream order, read from the back
	have := 0
	if joblog.InView(last.Header.Get(joblog.HeaderKind), raw) {
		parts, have = [][]byte{last.Data}, len(last.Data)
	}
	read := uint64(1) // the subject's messages at or after hi
	hi := last.Sequence
	perMsg := float64(max(len(last.Data), 1)) // bytes of the view per message
	if info.State.Msgs > 0 {
		perMsg = max(perMsg, float64(info.State.Bytes)/float64(info.State.Msgs))
	}
	density := 1.0 // the subject's messages per stream sequence
	for have <= maxBytes && read < total && hi > first {
		want := float64(maxBytes+1-have)/perMsg + 1
		span := uint64(min(math.Ceil(want/density), float64(hi-first)))
		lo := hi - max(span, 1)
		w, err := readWindow(ctx, stream, subject, raw, lo, hi, read)
		t.Messages += w.fetched
		if err != nil {
			return t, err
		}
		if w.bytes > 0 {
			parts = append([][]byte{w.data}, parts...)
			have += w.bytes
			perMsg = float64(w.bytes) / float64(w.msgs)
		}
		if w.msgs > 0 {
			density = float64(w.msgs) / float64(hi-lo)
		} else {
			density /= 4
		}
		read += uint64(w.msgs)
		hi = lo
	}
	data := make([]byte, 0, min(have, maxBytes))
	skip := max(have-maxBytes, 0)
	for _, p := range parts {
		if skip >= len(p) {
			skip -= len(p)
			continue
		}
		data = append(data, p[skip:]...)
		skip = 0
	}
	if have > maxBytes {
		t.Cut = true
		for len(data) > 0 && !utf8.RuneStart(data[0]) {
			data = data[1:]
		}
	}
	t.Data = data
	return t, nil
}

// window is what readWindow read: the view's bytes of the subject's
// messages in the window, how many of those messages there were, and how
// many messages were fetched (one more when it reached past the window).
type window struct {
	data    []byte
	bytes   int
	msgs    int
	fetched int
}

// readWindow reads the subject's messages with stream sequences in
// [lo, hi), keeping the bytes of the view raw selects, through a consumer
// of its own that it deletes when it returns. above is how many of the
// subject's messages from hi on exist: the consumer's pending count less
// above is how many to fetch.
func readWindow(ctx context.Context, stream jetstream.Stream, subject string, raw bool, lo, hi, above uint64) (window, error) {
	var w window
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: subject,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   lo,
		AckPolicy:     jetstream.AckNonePolicy,
		MemoryStorage: true,
		Replicas:      1,
		// Should the delete below not reach the server.
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return w, fmt.Errorf("reading %s: %w", subject, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
		cancel()
	}()
	pending := cons.CachedInfo().NumPending
	if pending <= above {
		return w, nil
	}
	left := int(pending - above)
	for left > 0 {
		batch, err := cons.FetchNoWait(min(left, fetchBatch))
		if err != nil {
			return w, fmt.Errorf("reading %s: %w", subject, err)
		}
		n := 0
		past := false
		for msg := range batch.Messages() {
			n++
			w.fetched++
			meta, err := msg.Metadata()
			if err != nil {
				return w, fmt.Errorf("reading %s: %w", subject, err)
			}
			if past || meta.Sequence.Stream >= hi {
				past = true // arrived after the count was taken
				continue
			}
			w.msgs++
			if joblog.InView(msg.Headers().Get(joblog.HeaderKind), raw) {
				w.data = append(w.data, msg.Data()...)
				w.bytes += len(msg.Data())
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return w, fmt.Errorf("reading %s: %w", subject, err)
		}
		if n == 0 || past {
			break
		}
		left -= n
	}
	return w, nil
}
