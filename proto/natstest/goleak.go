package natstest

import "go.uber.org/goleak"

// IgnoreServer returns goleak options that leave out the embedded
// nats-server's own background goroutines. Shutdown stops them, but some
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
	}
}
