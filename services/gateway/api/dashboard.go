package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/index"
)

// Figures returns the JOBS stream's and the runner consumer's figures, nil
// while NATS is away: they are best effort, and both are O(1) info
// requests whatever the queue depth.
func (s *Server) Figures(ctx context.Context) (*StreamFigures, *ConsumerFigures) {
	b := s.backend.Load()
	if b == nil || b.nc.Status() != nats.CONNECTED {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := b.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return nil, nil
	}
	var sf *StreamFigures
	var cf *ConsumerFigures
	if info, err := st.Info(ctx); err == nil {
		sf = &StreamFigures{Name: info.Config.Name, Messages: info.State.Msgs, Bytes: info.State.Bytes}
	}
	if c, err := st.Consumer(ctx, proto.ConsumerRunner); err == nil {
		if info, err := c.Info(ctx); err == nil {
			cf = &ConsumerFigures{
				Name: info.Name, Pending: info.NumPending, Running: info.NumAckPending,
				Redelivered: info.NumRedelivered, Waiting: info.NumWaiting,
			}
		}
	}
	return sf, cf
}

// DeadLetter is one job in JOBS_DLQ, with why and when it landed there.
type DeadLetter struct {
	Seq      uint64
	Job      proto.Job
	Reason   string
	Attempts int
	Time     time.Time
}

// DeadLetters returns up to limit jobs of JOBS_DLQ, the latest first. A
// message that does not decode is shown with what its headers say.
func (s *Server) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	b := s.backend.Load()
	if b == nil {
		return nil, refuse(http.StatusServiceUnavailable, "JetStream unavailable: not connected to NATS yet")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := b.js.Stream(ctx, proto.StreamDLQ)
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "opening %s: %v", proto.StreamDLQ, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "reading %s: %v", proto.StreamDLQ, err)
	}
	var out []DeadLetter
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && seq > 0 && len(out) < limit; seq-- {
		data, hdr, err := deadLetter(ctx, b.js, seq)
		if err != nil {
			continue // deleted from the middle of the stream
		}
		d := DeadLetter{Seq: seq, Reason: nats.Header(hdr).Get(proto.HeaderDLQReason)}
		d.Attempts, _ = strconv.Atoi(nats.Header(hdr).Get(proto.HeaderDLQAttempts))
		d.Time, _ = time.Parse(time.RFC3339Nano, nats.Header(hdr).Get(proto.HeaderDLQTime))
		if job, err := proto.DecodeJob(data); err == nil || job != nil {
			d.Job = *job
		}
		out = append(out, d)
	}
	return out, nil
}

// Jobs returns the jobs of the index that match f (see Index.List).
func (s *Server) Jobs(f index.Filter, offset, limit int) ([]index.Recent, int) {
	return s.Index.List(f, offset, limit)
}

// Counts returns the number of jobs in each state.
func (s *Server) Counts() map[proto.State]int { return s.Index.Counts() }

// SpoolDepth is the number of events waiting in the gateway's spool.
func (s *Server) SpoolDepth() int { return s.Queue.SpoolDepth() }

// Projects returns the keys of the registry's projects.
func (s *Server) Projects() []string {
	var keys []string
	for _, p := range s.Registry().Projects() {
		keys = append(keys, p.Key)
	}
	return keys
}
