package service

import "sync"

// Reconnects tells a connection's KV watchers that it was remade, so that
// each can start its watch again at once. A watch is an ordered consumer
// on one server: when that server restarts, nats.go remakes the consumer
// only after two missed idle heartbeats (10 s), or twice that when its
// first try meets a JetStream still starting, and the watcher sees
// nothing in the meantime.
type Reconnects struct {
	mu   sync.Mutex
	next chan struct{}
}

// NewReconnects returns a Reconnects to hand to Connect.
func NewReconnects() *Reconnects { return &Reconnects{next: make(chan struct{})} }

// Next returns a channel that is closed at the connection's next
// reconnect. A nil Reconnects never closes it.
func (r *Reconnects) Next() <-chan struct{} {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

func (r *Reconnects) reconnected() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.next)
	r.next = make(chan struct{})
}
