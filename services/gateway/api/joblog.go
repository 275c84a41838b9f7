package api

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/logread"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// HeaderAttempt names the attempt a GET /jobs/{id}/log answer shows.
const HeaderAttempt = "X-Orch-Attempt"

// jobLog answers GET /jobs/{id}/log: one attempt's output from JOBS_LOGS
// as text/plain, the latest attempt unless ?attempt=N, the readable view
// unless ?raw=1. With ?follow=1 the answer is chunked and streams output
// as it arrives, until the attempt ends or the client goes away. Any
// gateway serves any job: the output is read from the stream, never from
// a runner's disk.
func (s *Server) jobLog(w http.ResponseWriter, r *http.Request) {
	b, st, ok := s.lookup(w, r)
	if !ok {
		return
	}
	id := st.Job.ID
	q := r.URL.Query()
	attempt := st.Attempt
	if v := q.Get("attempt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "attempt: want a number from 1")
			return
		}
		attempt = n
	}
	raw, follow := q.Get("raw") == "1", q.Get("follow") == "1"

	if raw {
		// The agent's bytes as printed, which need not be UTF-8.
		w.Header().Set("Content-Type", "text/plain")
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(HeaderAttempt, strconv.Itoa(attempt))
	if attempt < 1 {
		// Not started yet: no output.
		w.WriteHeader(http.StatusOK)
		return
	}
	rc := http.NewResponseController(w)
	if follow {
		// A follow lasts as long as the attempt, past the server's
		// write timeout.
		_ = rc.SetWriteDeadline(time.Time{})
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
	}
	opts := logread.ReadOptions{
		Raw: raw, Follow: follow,
		Ended: func(ctx context.Context) bool { return s.attemptEnded(ctx, b.status, id, attempt) },
		Flush: func() { _ = rc.Flush() },
	}
	cw := &countingWriter{w: w}
	err := logread.Copy(r.Context(), b.js, id, attempt, cw, opts)
	if err != nil && r.Context().Err() == nil {
		logFrom(r).Warn("reading job log", zap.String("job", id), zap.Int("attempt", attempt), zap.Error(err))
		if !follow && cw.n == 0 {
			writeError(w, http.StatusServiceUnavailable, "log stream unavailable")
		}
	}
}

// countingWriter counts what was written, to tell whether an error can
// still be answered as one.
type countingWriter struct {
	w http.ResponseWriter
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}

// attemptEnded reports whether attempt of job id is over, or will never
// run: a runner that died wrote no end message, but the record moves on.
func (s *Server) attemptEnded(ctx context.Context, st *status.Store, id string, attempt int) bool {
	rec, _, err := st.Get(ctx, id)
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

// OpenLog returns the readable output of attempt n of the job st
// describes, read from JOBS_LOGS: the dashboard's log reader. With follow
// the reader waits for more output until the attempt ends or ctx ends.
// Closing the reader stops the read and waits for it.
func (s *Server) OpenLog(ctx context.Context, st *proto.Status, n int, follow bool) (io.ReadCloser, error) {
	b := s.backend.Load()
	if b == nil {
		return nil, errors.New("log stream unavailable: not connected to NATS yet")
	}
	if has, err := logread.HasOutput(ctx, b.js, st.Job.ID, n); err != nil || (!has && !follow) {
		return nil, cmp.Or(err, errNoOutput)
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		opts := logread.ReadOptions{Follow: follow,
			Ended: func(ctx context.Context) bool { return s.attemptEnded(ctx, b.status, st.Job.ID, n) }}
		pw.CloseWithError(logread.Copy(ctx, b.js, st.Job.ID, n, pw, opts))
	}()
	return &pipeLog{PipeReader: pr, stop: func() { cancel(); _ = pr.Close(); <-done }}, nil
}

// errNoOutput says an attempt has no output in JOBS_LOGS.
var errNoOutput = errors.New("no output")

// pipeLog is the reader OpenLog returns: closing it ends its goroutine.
type pipeLog struct {
	*io.PipeReader
	stop func()
}

func (p *pipeLog) Close() error {
	p.stop()
	return nil
}
