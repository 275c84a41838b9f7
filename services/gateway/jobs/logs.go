package jobs

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/orch-dev/orch/kit/logread"
	"github.com/orch-dev/orch/proto"
)

// ErrNoOutput says an attempt has no output in JOBS_LOGS (yet).
var ErrNoOutput = errors.New("no output")

// LogTail returns the end of the readable output of attempt n of the job
// st describes, at most maxBytes: read from the end of JOBS_LOGS, so that
// a page showing a long log costs its tail, not the log (see
// logread.ReadTail). An attempt without output is not Found.
func (s *Service) LogTail(ctx context.Context, st *proto.Status, n, maxBytes int) (logread.TailOf, error) {
	c, err := s.connected()
	if err != nil {
		return logread.TailOf{}, err
	}
	return logread.ReadTail(ctx, c.js, st.Job.ID, n, false, maxBytes)
}

// LogOptions say which view of an attempt's output CopyLog writes and
// whether it follows it.
type LogOptions struct {
	// Raw selects the agent's bytes as printed instead of the readable
	// form.
	Raw bool
	// Follow keeps writing output as it arrives until the attempt ends.
	Follow bool
	// Flush is called after each write while following, so the client
	// sees it at once.
	Flush func()
}

// CopyLog writes attempt n's output of the job st describes to w, in
// order, from JOBS_LOGS: any gateway serves any job, never from a
// runner's disk. Without Follow an attempt with no output gives
// ErrNoOutput. With Follow it writes what arrives until the attempt ends
// (its end message, or its status record moving on, for a runner that
// died before writing one), ctx ends, or Close is called: a gateway
// shutting down does not wait for the logs it is streaming.
func (s *Service) CopyLog(ctx context.Context, st *proto.Status, n int, w io.Writer, o LogOptions) error {
	c, err := s.connected()
	if err != nil {
		return err
	}
	id := st.Job.ID
	if !o.Follow {
		has, err := logread.HasOutput(ctx, c.js, id, n)
		if err != nil {
			return refuse(http.StatusServiceUnavailable, "log stream unavailable")
		}
		if !has {
			return ErrNoOutput
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life(), cancel)()
	return logread.Copy(ctx, c.js, id, n, w, logread.ReadOptions{
		Raw: o.Raw, Follow: o.Follow, Flush: o.Flush,
		Ended: func(ctx context.Context) bool { return s.attemptEnded(ctx, c, id, n) },
	})
}

// attemptEnded reports whether attempt of job id is over, or will never
// run: a runner that died wrote no end message, but the record moves on.
func (s *Service) attemptEnded(ctx context.Context, c *conn, id string, attempt int) bool {
	rec, _, err := c.status.Get(ctx, id)
	if err != nil {
		return false
	}
	switch {
	case rec.Attempt > attempt:
		return true
	case rec.Attempt == attempt:
		return rec.State != proto.StateRunning
	default:
		return rec.State.Terminal()
	}
}

// Close ends the followed logs being written; further ones end at once.
// The gateway calls it when its HTTP server begins to shut down.
func (s *Service) Close() { s.end() }
