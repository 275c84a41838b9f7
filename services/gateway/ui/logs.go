package ui

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/jobs"
)

// ErrNoLog says an attempt's log cannot be read from here.
var ErrNoLog = errors.New("log not available")

// LogTailBytes is how much of an attempt's log a page shows; the rest is
// a link away. Only about this much is read from JOBS_LOGS, however long
// the log (jobs.Service.LogTail).
const LogTailBytes = 256 << 10

// attemptLog is one attempt's log on the job page.
type attemptLog struct {
	N int
	// Live is set while the attempt runs: the script follows its log.
	Live bool
	Text string
	// Cut says the text is only the log's tail.
	Cut bool
	// Missing says there is no log to show.
	Missing bool
}

// attemptLive reports whether attempt n of the job is still producing
// output.
func attemptLive(st *proto.Status, n int) bool {
	return st.Attempt == n && st.State == proto.StateRunning
}

// attemptLog reads the tail of attempt n's log for the job page.
func (h *Handler) attemptLog(r *http.Request, st *proto.Status, n int) attemptLog {
	a := attemptLog{N: n, Live: attemptLive(st, n)}
	tail, err := h.cfg.Jobs.LogTail(r.Context(), st, n, LogTailBytes)
	if err != nil {
		h.cfg.Log.Warn("reading an agent log", zap.String("job", st.Job.ID), zap.Int("attempt", n), zap.Error(err))
	}
	if err != nil || !tail.Found {
		a.Missing = true
		return a
	}
	a.Text, a.Cut = string(tail.Data), tail.Cut
	return a
}

// logText answers an attempt's log as plain text (?attempt=, default the
// latest); with ?follow=1 it streams while the attempt runs. The page's
// script reads the stream; a person can open it too.
func (h *Handler) logText(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	n := st.Attempt
	if v := r.URL.Query().Get("attempt"); v != "" {
		a, err := strconv.Atoi(v)
		if err != nil || a < 1 || a > st.Attempt {
			h.errorPage(w, r, http.StatusNotFound, "This job has no such attempt.")
			return
		}
		n = a
	}
	if n < 1 {
		h.errorPage(w, r, http.StatusNotFound, ErrNoLog.Error())
		return
	}
	opts := jobs.LogOptions{Follow: r.URL.Query().Get("follow") == "1"}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	lw := &lazyWriter{w: w}
	if opts.Follow {
		// The server's write timeout is for ordinary answers; a followed
		// log lasts as long as the attempt.
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		w.Header().Set("X-Accel-Buffering", "no") // nginx: pass each chunk on at once
		w.WriteHeader(http.StatusOK)
		lw.started = true
		opts.Flush = func() { _ = rc.Flush() }
	}
	err := h.cfg.Jobs.CopyLog(r.Context(), st, n, lw, opts)
	if err != nil && !lw.started && r.Context().Err() == nil {
		if !errors.Is(err, jobs.ErrNoOutput) {
			h.cfg.Log.Warn("reading an agent log", zap.String("job", st.Job.ID), zap.Int("attempt", n), zap.Error(err))
		}
		w.Header().Set("Cache-Control", "no-store")
		h.errorPage(w, r, http.StatusNotFound, ErrNoLog.Error())
	}
}

// lazyWriter writes through to w and notes that it has, so that an error
// before the first byte can still be answered with a page.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	l.started = true
	return l.w.Write(p)
}
