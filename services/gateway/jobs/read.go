package jobs

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/queue"
)

// Job returns the job's status record, which carries the job, or, for a
// job waiting in JOBS with no record yet, the job as queued: a 404
// Refusal for an id that names no job, 503 while JetStream is
// unreachable.
func (s *Service) Job(ctx context.Context, id string) (*proto.Status, error) {
	if id == "" || proto.Token(id) != id {
		return nil, refuse(http.StatusNotFound, "no such job")
	}
	st, err := s.cfg.Queue.Job(ctx, id)
	switch {
	case errors.Is(err, status.ErrNotFound):
		return nil, refuse(http.StatusNotFound, "no such job")
	case errors.Is(err, queue.ErrUnavailable):
		return nil, refuse(http.StatusServiceUnavailable, "status store unavailable: %v", err)
	case err != nil:
		s.log(ctx).Warn("reading job", zap.String("job", id), zap.Error(err))
		return nil, refuse(http.StatusServiceUnavailable, "status store unavailable")
	}
	return st, nil
}

// Summary is the state of the queue: how many jobs are in each state, the
// JOBS stream's and the runner consumer's figures (nil while NATS is
// away), the gateway's spool, each project's queued, running and held
// jobs and pause, and the jobs updated last.
type Summary struct {
	Counts   map[proto.State]int `json:"counts"`
	Stream   *StreamFigures      `json:"stream"`
	Consumer *ConsumerFigures    `json:"consumer"`
	Spool    SpoolFigures        `json:"spool"`
	Projects []ProjectFigures    `json:"projects"`
	Recent   []index.Recent      `json:"recent"`
}

// StreamFigures are the JOBS stream's figures.
type StreamFigures struct {
	Name     string `json:"name"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
}

// ConsumerFigures are the runner consumer's figures: Pending is waiting for
// a runner, Running is held by one, Redelivered came back at least once.
type ConsumerFigures struct {
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`
	Running     int    `json:"running"`
	Redelivered int    `json:"redelivered"`
	Waiting     int    `json:"waiting"`
}

// SpoolFigures describe the gateway's local spool: Depth events wait for
// JetStream, the oldest of them for OldestAgeSeconds (0 when none waits).
type SpoolFigures struct {
	Depth            int     `json:"depth"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

// Queue returns the queue's summary with the recent jobs updated last
// (at most recent of them).
func (s *Service) Queue(ctx context.Context, recent int) Summary {
	s.cfg.Queue.SettleAll(ctx) // a job answered just now is listed
	sum := Summary{Counts: s.Counts(), Recent: s.cfg.Index.Recent(recent), Spool: s.Spool()}
	sum.Stream, sum.Consumer = s.Figures(ctx)
	sum.Projects = s.ProjectFigures(ctx)
	return sum
}

// Counts returns the number of jobs in each state.
func (s *Service) Counts() map[proto.State]int { return s.cfg.Index.Counts() }

// List returns the jobs of the index that match f, and how many match
// (see index.Index.List).
func (s *Service) List(f index.Filter, offset, limit int) ([]index.Recent, int) {
	return s.cfg.Index.List(f, offset, limit)
}

// Spool returns the figures of the gateway's spool.
func (s *Service) Spool() SpoolFigures {
	return SpoolFigures{Depth: s.cfg.Queue.SpoolDepth(), OldestAgeSeconds: s.cfg.Queue.SpoolOldestAge().Seconds()}
}

// Figures returns the JOBS stream's and the runner consumer's figures, nil
// while NATS is away: they are best effort, and both are O(1) info
// requests whatever the queue depth.
func (s *Service) Figures(ctx context.Context) (*StreamFigures, *ConsumerFigures) {
	c := s.conn.Load()
	if c == nil || c.nc.Status() != nats.CONNECTED {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return nil, nil
	}
	var sf *StreamFigures
	var cf *ConsumerFigures
	if info, err := st.Info(ctx); err == nil {
		sf = &StreamFigures{Name: info.Config.Name, Messages: info.State.Msgs, Bytes: info.State.Bytes}
	}
	if cons, err := st.Consumer(ctx, proto.ConsumerRunner); err == nil {
		if info, err := cons.Info(ctx); err == nil {
			cf = &ConsumerFigures{
				Name: info.Name, Pending: info.NumPending, Running: info.NumAckPending,
				Redelivered: info.NumRedelivered, Waiting: info.NumWaiting,
			}
		}
	}
	return sf, cf
}

// MaxAttempts is how many attempts a job gets: the runner consumer's
// MaxDeliver, which the runners set from ORCH_MAX_ATTEMPTS. A queued
// job's record has none yet (the gateway does not know the runners'
// setting); 0 while the consumer cannot be read.
func (s *Service) MaxAttempts(ctx context.Context) int {
	c := s.conn.Load()
	if c == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cons, err := c.js.Consumer(ctx, proto.StreamJobs, proto.ConsumerRunner)
	if err != nil {
		return 0
	}
	return cons.CachedInfo().Config.MaxDeliver
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
func (s *Service) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	c, err := s.connected()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, proto.StreamDLQ)
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "opening %s: %v", proto.StreamDLQ, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "reading %s: %v", proto.StreamDLQ, err)
	}
	var out []DeadLetter
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && seq > 0 && len(out) < limit; seq-- {
		data, hdr, err := deadLetter(ctx, c.js, seq)
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

// Projects returns the keys of the registry's projects.
func (s *Service) Projects() []string {
	var keys []string
	for _, p := range s.cfg.Registry().Projects() {
		keys = append(keys, p.Key)
	}
	return keys
}
