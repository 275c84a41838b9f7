// Package logread reads an agent's output back from the stream JOBS_LOGS,
// in the format of proto/joblog: one attempt's view whole, followed live
// as it arrives, or its tail. Every service that shows a log (the
// gateway's API and dashboard, the notifier's alerts) reads it here.
package logread

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
)

// ReadOptions say which view to read and whether to follow it.
type ReadOptions struct {
	// Raw selects the agent's raw output instead of the readable form.
	Raw bool
	// Follow keeps reading as output arrives until the attempt's end
	// message, or until Ended reports the attempt over.
	Follow bool
	// Ended is asked every PollInterval while following with nothing to
	// read: a runner that died wrote no end message, and its attempt is
	// over when the job's status record has moved on.
	Ended func(ctx context.Context) bool
	// PollInterval is how long a follow waits for output before it asks
	// Ended. Default 2s.
	PollInterval time.Duration
	// Flush is called after each message written while following, so
	// that the reader sees it at once.
	Flush func()
}

// Copy writes the chosen view of one attempt's output to w, in order. It
// reads through an ephemeral ordered consumer filtered on the attempt's
// subject, which it deletes when it returns (whatever the reason, such as
// ctx ending when an HTTP client goes away); the server removes it anyway
// after a short inactivity should the delete not reach it. An attempt
// with no output yet writes nothing and, without Follow, returns nil.
func Copy(ctx context.Context, js jetstream.JetStream, jobID string, attempt int, w io.Writer, o ReadOptions) error {
	subject := proto.LogSubject(jobID, attempt)
	stream, err := js.Stream(ctx, proto.StreamLogs)
	if err != nil {
		return fmt.Errorf("opening stream %s: %w", proto.StreamLogs, err)
	}
	var lastSeq uint64
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if !o.Follow {
			return nil
		}
	case err != nil:
		return fmt.Errorf("reading %s: %w", subject, err)
	default:
		lastSeq = last.Sequence
		if last.Header.Get(joblog.HeaderKind) == joblog.KindEnd {
			o.Follow = false
		}
	}
	cons, err := js.OrderedConsumer(ctx, proto.StreamLogs, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subject},
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("reading %s: %w", subject, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(64))
	if err != nil {
		return fmt.Errorf("reading %s: %w", subject, err)
	}
	defer func() {
		it.Stop()
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = js.DeleteConsumer(dctx, proto.StreamLogs, info.Name)
			cancel()
		}
	}()
	poll := o.PollInterval
	if poll <= 0 {
		poll = 2 * time.Second
	}
	var seen uint64
	for o.Follow || seen < lastSeq {
		nctx, cancel := context.WithTimeout(ctx, poll)
		msg, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
				return fmt.Errorf("reading %s: %w", subject, err)
			}
			if o.Follow && o.Ended != nil && o.Ended(ctx) {
				// Read what arrived meanwhile, then stop.
				o.Follow = false
				if m, err := stream.GetLastMsgForSubject(ctx, subject); err == nil {
					lastSeq = m.Sequence
				}
			}
			continue
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("reading %s: %w", subject, err)
		}
		seen = meta.Sequence.Stream
		kind := msg.Headers().Get(joblog.HeaderKind)
		if kind == joblog.KindEnd {
			return nil
		}
		if joblog.InView(kind, o.Raw) {
			if _, err := w.Write(msg.Data()); err != nil {
				return err
			}
			if o.Follow && o.Flush != nil {
				o.Flush()
			}
		}
	}
	return nil
}

// HasOutput reports whether the attempt has any message in the stream.
func HasOutput(ctx context.Context, js jetstream.JetStream, jobID string, attempt int) (bool, error) {
	stream, err := js.Stream(ctx, proto.StreamLogs)
	if err != nil {
		return false, fmt.Errorf("opening stream %s: %w", proto.StreamLogs, err)
	}
	_, err = stream.GetLastMsgForSubject(ctx, proto.LogSubject(jobID, attempt))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return err == nil, err
}
