package index

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
)

// A job waiting in JOBS may have no status record: the gateway's intake
// costs one durable write, the publish, and the runner that takes the job
// creates its record (status.StartAttempt from absent), or the gateway
// does once the job has waited a second (queue.Queue.RecordWaiting).
// Until then the index knows the job from JOBS itself: from the publish's
// ack on this gateway (Queued, before the webhook is answered) and from
// reading JOBS without a consumer (FollowJobs; a WorkQueue stream takes no
// second consumer that overlaps the runner's), which finds the jobs other
// gateways queued and the ones queued before this gateway started. Such an
// entry says queued until the job's record replaces it, and goes when
// JOBS no longer holds the job.

// Queued adds job, which this gateway published and JOBS holds at
// sequence seq, as queued (see queued). FollowJobs does not read the
// message again.
func (ix *Index) Queued(job *proto.Job, seq uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if seq >= ix.next {
		ix.own[seq] = struct{}{}
	}
	ix.queued(job, seq)
}

// queued adds job, which JOBS holds at sequence seq, as queued, unless the
// index knows the job already: its record, when there is one, says more.
// The caller holds mu.
func (ix *Index) queued(job *proto.Job, seq uint64) {
	if _, ok := ix.byID[job.ID]; ok {
		return
	}
	ix.add(&Recent{
		ID: job.ID, Kind: job.Kind, Project: job.Project, Task: job.Task.ID, Title: job.Task.Title,
		State: proto.StateQueued, UpdatedAt: job.CreatedAt, CreatedAt: job.CreatedAt,
		planeItem: job.Task.PlaneItem, seq: seq, since: time.Now(),
	})
}

// Waiting returns the sequence in JOBS of job id when the index knows the
// job from JOBS alone: it has no status record yet.
func (ix *Index) Waiting(id string) (uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if r, ok := ix.waiting[id]; ok {
		return r.seq, true
	}
	return 0, false
}

// WaitingFor returns the jobs known from JOBS alone for at least d, with
// their sequences: jobs no runner has taken since.
func (ix *Index) WaitingFor(d time.Duration) map[string]uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string]uint64{}
	for id, r := range ix.waiting {
		if time.Since(r.since) >= d {
			out[id] = r.seq
		}
	}
	return out
}

// keepWaiting removes the entries known from JOBS alone whose sequence is
// below end and not in seqs: JOBS no longer holds their job, which left it
// without a record (a purge, say).
func (ix *Index) keepWaiting(seqs map[uint64]struct{}, end uint64) {
	for id, seq := range ix.WaitingFor(0) {
		if _, ok := seqs[seq]; !ok && seq < end {
			ix.forget(id)
		}
	}
}

// forget removes job id if the index knows it from JOBS alone.
func (ix *Index) forget(id string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if _, ok := ix.waiting[id]; ok {
		ix.removeLocked(id)
	}
}

// Timing of FollowJobs.
const (
	// followEvery is how often JOBS is read for jobs queued by other
	// gateways (this one's are known at once).
	followEvery = time.Second
	// pruneEvery is how often the jobs known from JOBS alone are looked
	// for there, to drop the ones that left it without a record.
	pruneEvery = time.Minute
	// jobsBatch is how many messages one direct get returns.
	jobsBatch = 256
)

// FollowJobs keeps the index's jobs without a record current from JOBS
// until ctx ends: it reads JOBS whole at start and on a reconnect, its new
// messages every followEvery, and looks for the jobs it knows from there
// alone every pruneEvery. The index is Synced once both the status bucket
// and JOBS were read whole.
func (ix *Index) FollowJobs(ctx context.Context, nc *nats.Conn, rc *service.Reconnects, log *zap.Logger) {
	for ctx.Err() == nil {
		if err := ix.followOnce(ctx, nc, rc.Next()); err != nil && ctx.Err() == nil {
			log.Warn("reading queued jobs from JOBS, will retry", zap.Error(err))
			backoff.Sleep(ctx, time.Second)
		}
	}
}

func (ix *Index) followOnce(ctx context.Context, nc *nats.Conn, reconnected <-chan struct{}) error {
	seqs := map[uint64]struct{}{}
	next, err := ix.readJobs(ctx, nc, 1, seqs)
	if err != nil {
		return err
	}
	ix.keepWaiting(seqs, next)
	ix.mu.Lock()
	ix.jobsSynced = true
	ix.mu.Unlock()
	follow := time.NewTicker(followEvery)
	defer follow.Stop()
	prune := time.NewTicker(pruneEvery)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reconnected:
			return nil
		case <-follow.C:
			if next, err = ix.readJobs(ctx, nc, ix.skipOwn(next), nil); err != nil {
				return err
			}
		case <-prune.C:
			if err := ix.prune(ctx, nc); err != nil {
				return err
			}
		}
	}
}

// prune forgets the jobs known from JOBS alone that JOBS no longer holds.
func (ix *Index) prune(ctx context.Context, nc *nats.Conn) error {
	for id, seq := range ix.WaitingFor(0) {
		if _, ok, err := JobAt(ctx, nc, seq); err != nil {
			return err
		} else if !ok {
			ix.forget(id)
		}
	}
	return nil
}

// skipOwn returns the first sequence from next on that this gateway did
// not publish itself (Queued): with one gateway, FollowJobs reads nothing.
func (ix *Index) skipOwn(next uint64) uint64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for {
		if _, ok := ix.own[next]; !ok {
			break
		}
		delete(ix.own, next)
		next++
	}
	ix.next = next
	return next
}

// readJobs reads JOBS from sequence from to its end, adding each job to
// the index (queued) and its sequence to seqs (when not nil), and returns
// the sequence after the last message read.
func (ix *Index) readJobs(ctx context.Context, nc *nats.Conn, from uint64, seqs map[uint64]struct{}) (uint64, error) {
	defer func() {
		ix.mu.Lock()
		for seq := range ix.own { // read past them
			if seq < from {
				delete(ix.own, seq)
			}
		}
		ix.next = from
		ix.mu.Unlock()
	}()
	for {
		msgs, more, err := directGet(ctx, nc, from, jobsBatch)
		if err != nil || len(msgs) == 0 {
			return from, err
		}
		for _, m := range msgs {
			if seqs != nil {
				seqs[m.seq] = struct{}{}
			}
			// Most are known (this gateway's own): only the others are
			// decoded.
			if m.id == "" || !ix.Has(m.id) {
				if job, err := proto.DecodeJob(m.data); err == nil {
					ix.mu.Lock()
					ix.queued(job, m.seq)
					ix.mu.Unlock()
				}
			}
			from = m.seq + 1
		}
		if !more {
			return from, nil
		}
	}
}

// JobAt returns the job JOBS holds at sequence seq, and false when JOBS no
// longer holds it.
func JobAt(ctx context.Context, nc *nats.Conn, seq uint64) (*proto.Job, bool, error) {
	msgs, _, err := directGet(ctx, nc, seq, 0)
	if err != nil || len(msgs) == 0 || msgs[0].seq != seq {
		return nil, false, err
	}
	job, err := proto.DecodeJob(msgs[0].data)
	if err != nil {
		return nil, false, fmt.Errorf("job at %s sequence %d: %w", proto.StreamJobs, seq, err)
	}
	return job, true, nil
}

// streamMsg is one message of a direct get: its sequence, its job's id
// (the Nats-Msg-Id it was published with) and the job.
type streamMsg struct {
	seq  uint64
	id   string
	data []byte
}

const (
	// directGetTimeout bounds a direct get's answer.
	directGetTimeout = 5 * time.Second
	// numPendingHeader is how many messages a batched direct get left
	// unread (nats.go names no constant for it).
	numPendingHeader = "Nats-Num-Pending"
)

// directGet reads up to batch messages of JOBS from sequence from on with
// one batched direct get (JOBS allows them, see proto.Topology.JobsStream)
// and reports whether JOBS holds more after them. No message at or after
// from is an empty answer. A batch of 0 reads the message at from alone:
// none when JOBS no longer holds it.
func directGet(ctx context.Context, nc *nats.Conn, from uint64, batch int) ([]streamMsg, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, directGetTimeout)
	defer cancel()
	req, err := json.Marshal(struct {
		Seq   uint64 `json:"seq"`
		Batch int    `json:"batch,omitempty"`
	}{from, batch})
	if err != nil {
		return nil, false, err
	}
	// A channel subscription reads the whole answer without waking once
	// per message (see the runner's lastSlots).
	inbox := nc.NewInbox()
	answers := make(chan *nats.Msg, batch+1)
	sub, err := nc.ChanSubscribe(inbox, answers)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+proto.StreamJobs, inbox, req); err != nil {
		return nil, false, err
	}
	var msgs []streamMsg
	for {
		var m *nats.Msg
		select {
		case m = <-answers:
		case <-ctx.Done():
			return nil, false, fmt.Errorf("direct get of %s: %w", proto.StreamJobs, context.Cause(ctx))
		}
		switch status, descr := m.Header.Get("Status"), m.Header.Get("Description"); {
		case status == "":
		case status == "204": // end of batch
			pending, _ := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64)
			return msgs, pending > 0, nil
		case status == "404":
			return msgs, false, nil
		default:
			return nil, false, fmt.Errorf("direct get of %s: %w", proto.StreamJobs, errors.New(status+" "+descr))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("direct get of %s: sequence: %w", proto.StreamJobs, err)
		}
		msgs = append(msgs, streamMsg{seq: seq, id: m.Header.Get(jetstream.MsgIDHeader), data: m.Data})
		if batch == 0 {
			return msgs, false, nil
		}
	}
}
