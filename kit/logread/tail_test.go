package logread_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/logread"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// publish writes one log message of attempt n of job id as a runner does.
func publish(t *testing.T, js jetstream.JetStream, id string, n int, kind string, data []byte) {
	t.Helper()
	msg := nats.NewMsg(proto.LogSubject(id, n))
	msg.Header.Set(joblog.HeaderKind, kind)
	msg.Data = data
	if _, err := js.PublishMsgAsync(msg); err != nil {
		t.Fatal(err)
	}
}

// flush waits for every asynchronous publish to be stored.
func flush(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
}

// chunk is the i-th batch of an agent's output: numbered lines, size
// bytes in all.
func chunk(i, size int) []byte {
	var b bytes.Buffer
	for n := 0; b.Len() < size; n++ {
		fmt.Fprintf(&b, "batch %05d line %04d: the agent keeps talking\n", i, n)
	}
	return b.Bytes()[:size]
}

// whole reads a view of an attempt's output with Copy, the reference.
func whole(t *testing.T, js jetstream.JetStream, id string, n int, raw bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := logread.Copy(context.Background(), js, id, n, &buf, logread.ReadOptions{Raw: raw}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The tail of a 10 MiB log is read from the messages at its end: the
// read fetches about the tail's worth of messages, not the log's, and
// what it returns is the end of what the whole read returns.
func TestReadTailFetchesOnlyTheEnd(t *testing.T) {
	t.Parallel()
	js, _ := natstest.JetStream(t)
	const msgBytes, msgs, tailBytes = 16 << 10, 640, 256 << 10 // 10 MiB
	for i := range msgs {
		publish(t, js, "long", 1, joblog.KindBoth, chunk(i, msgBytes))
		if i%3 == 0 { // another attempt running beside it
			publish(t, js, "beside", 1, joblog.KindBoth, chunk(i, 4<<10))
		}
	}
	publish(t, js, "long", 1, joblog.KindEnd, []byte("the end message is in no view"))
	flush(t, js)

	tail, err := logread.ReadTail(context.Background(), js, "long", 1, false, tailBytes)
	if err != nil {
		t.Fatal(err)
	}
	all := whole(t, js, "long", 1, false)
	if len(all) != msgs*msgBytes {
		t.Fatalf("the whole log is %d bytes, want %d", len(all), msgs*msgBytes)
	}
	if !bytes.Equal(tail.Data, all[len(all)-tailBytes:]) || !tail.Cut || !tail.Found {
		t.Errorf("tail: %d bytes, cut %v, found %v; want the last %d bytes of the log, cut", len(tail.Data), tail.Cut, tail.Found, tailBytes)
	}
	// The tail is 16 messages; a window may overshoot, but never by the
	// log's length.
	if need := tailBytes / msgBytes; tail.Messages > 3*need {
		t.Errorf("the tail read fetched %d messages of %d, want at most %d", tail.Messages, msgs, 3*need)
	}
	t.Logf("fetched %d of %d messages", tail.Messages, msgs)
}

// Short logs are read whole, each view on its own; an attempt without
// output is not found.
func TestReadTailViews(t *testing.T) {
	t.Parallel()
	js, _ := natstest.JetStream(t)
	// stream-json: each readable batch is followed by its raw bytes.
	for i := range 40 {
		publish(t, js, "mixed", 1, joblog.KindText, []byte(fmt.Sprintf("text %02d ✓\n", i)))
		publish(t, js, "mixed", 1, joblog.KindRaw, []byte(fmt.Sprintf(`{"raw":%d}`+"\n", i)))
	}
	publish(t, js, "short", 1, joblog.KindBoth, []byte("only line\n"))
	publish(t, js, "short", 1, joblog.KindEnd, []byte("only line"))
	flush(t, js)
	ctx := context.Background()

	for _, tc := range []struct {
		name  string
		id    string
		raw   bool
		max   int
		cut   bool
		found bool
	}{
		{"text view, all of it", "mixed", false, 1 << 20, false, true},
		{"raw view, all of it", "mixed", true, 1 << 20, false, true},
		{"text view, its end", "mixed", false, 100, true, true},
		{"raw view, its end", "mixed", true, 100, true, true},
		{"one message and the end", "short", false, 1 << 10, false, true},
		{"no output", "none", false, 1 << 10, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tail, err := logread.ReadTail(ctx, js, tc.id, 1, tc.raw, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			want := whole(t, js, tc.id, 1, tc.raw)
			if len(want) > tc.max {
				want = want[len(want)-tc.max:]
				for len(want) > 0 && want[0]&0xC0 == 0x80 {
					want = want[1:] // the tail starts at a character
				}
			}
			if string(tail.Data) != string(want) || tail.Cut != tc.cut || tail.Found != tc.found {
				t.Errorf("tail %q cut %v found %v, want %q cut %v found %v", tail.Data, tail.Cut, tail.Found, want, tc.cut, tc.found)
			}
		})
	}
}

// Tail, the alert's read, takes the end message when there is one and
// the end of the stream's output when the runner died before writing it.
func TestTail(t *testing.T) {
	t.Parallel()
	js, _ := natstest.JetStream(t)
	for i := range 20 {
		publish(t, js, "died", 1, joblog.KindBoth, chunk(i, 1<<10))
	}
	publish(t, js, "ended", 1, joblog.KindBoth, []byte("first\nsecond\n"))
	publish(t, js, "ended", 1, joblog.KindEnd, []byte("second"))
	flush(t, js)
	ctx := context.Background()
	if got, err := logread.Tail(ctx, js, "ended", 1, 100); err != nil || got != "second" {
		t.Errorf("Tail with an end message: %q, %v", got, err)
	}
	got, err := logread.Tail(ctx, js, "died", 1, 200)
	if err != nil || len(got) > 200 || !strings.HasPrefix(got, "batch 00019 line") || strings.HasSuffix(got, "\n") {
		t.Errorf("Tail without an end message: %q, %v", got, err)
	}
	if got, err := logread.Tail(ctx, js, "none", 1, 100); err != nil || got != "" {
		t.Errorf("Tail of no output: %q, %v", got, err)
	}
}
