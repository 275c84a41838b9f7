package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/services/gateway/jobs"
)

// HeaderAttempt names the attempt a GET /jobs/{id}/log answer shows.
const HeaderAttempt = "X-Orch-Attempt"

// jobLog answers GET /jobs/{id}/log: one attempt's output as text/plain,
// the latest attempt unless ?attempt=N, the readable view unless ?raw=1.
// With ?follow=1 the answer is chunked and streams output as it arrives,
// until the attempt ends or the client goes away (jobs.Service.CopyLog).
func (s *Server) jobLog(w http.ResponseWriter, r *http.Request) {
	st, ok := s.lookup(w, r)
	if !ok {
		return
	}
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
	opts := jobs.LogOptions{Raw: q.Get("raw") == "1", Follow: q.Get("follow") == "1"}
	if opts.Raw {
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
	if opts.Follow {
		// A follow lasts as long as the attempt, past the server's
		// write timeout.
		_ = rc.SetWriteDeadline(time.Time{})
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		opts.Flush = func() { _ = rc.Flush() }
	}
	cw := &countingWriter{w: w}
	err := s.Jobs.CopyLog(r.Context(), st, attempt, cw, opts)
	switch {
	case err == nil, errors.Is(err, jobs.ErrNoOutput), r.Context().Err() != nil:
	default:
		logFrom(r).Warn("reading job log", zap.String("job", st.Job.ID), zap.Int("attempt", attempt), zap.Error(err))
		if !opts.Follow && cw.n == 0 {
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
