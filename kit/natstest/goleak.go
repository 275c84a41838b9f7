package natstest

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// IgnoreServer returns goleak options that leave out the embedded
// nats-server's own background goroutines (and one of nats.go's, below). Shutdown stops them, but some
// (the file store's state flusher, the access-time ticker, queue pushes)
// end a moment later, and a test's goroutine check must judge the code
// under test, not the server's teardown.
func IgnoreServer() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ipQueue[...]).push"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).syncBlocks"),
		// Not the server's, but nats.go's own (v1.55.0, the newest): an
		// object store Put publishes through a JetStream context of its
		// own, whose first async publish starts resetPendingAcksOnReconnect,
		// and Put's deferred cleanupReplySub sets the status channel that
		// goroutine is about to read to nil. When the cleanup wins (a short
		// Put on a loaded machine), the goroutine waits on a nil channel for
		// good. orch's code cannot reach it; the runner's task-state saves
		// are few (one a minute per running job), so the cost is a rare
		// small goroutine.
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	}
}

// VerifyTestMain runs a package's tests and then fails them if any
// goroutine other than the embedded server's teardown is left running:
// the TestMain of every package whose code starts goroutines. Idle
// keep-alive connections of http.DefaultClient are closed first; they
// belong to the client, not to the code under test.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		http.DefaultClient.CloseIdleConnections()
		if err := goleak.Find(append(IgnoreServer(), opts...)...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
