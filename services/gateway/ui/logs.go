package ui

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
)

// ErrNoLog says an attempt's log cannot be read from here.
var ErrNoLog = errors.New("log not available")

// LogReader reads the agent's output of one attempt of a job.
type LogReader interface {
	// OpenLog returns the output of attempt n of the job st describes.
	// With follow, reading waits for more output while the attempt runs
	// and ends (io.EOF) once it has ended, or when ctx ends. ErrNoLog
	// says there is nothing to read from here.
	OpenLog(ctx context.Context, st *proto.Status, n int, follow bool) (io.ReadCloser, error)
}

// LogTailBytes is how much of an attempt's log a page shows; the rest is
// a link away.
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

func (h *Handler) attemptLog(r *http.Request, st *proto.Status, n int) attemptLog {
	a := attemptLog{N: n, Live: attemptLive(st, n)}
	if h.cfg.Logs == nil {
		a.Missing = true
		return a
	}
	rc, err := h.cfg.Logs.OpenLog(r.Context(), st, n, false)
	if err != nil {
		if !errors.Is(err, ErrNoLog) {
			h.cfg.Log.Warn("reading an agent log", zap.String("job", st.Job.ID), zap.Int("attempt", n), zap.Error(err))
		}
		a.Missing = true
		return a
	}
	defer rc.Close()
	// Keep the last LogTailBytes: a ring of two buffers would be leaner,
	// but a page's log is small next to what the runner keeps.
	data, err := io.ReadAll(rc)
	if err != nil {
		a.Missing = true
		return a
	}
	if len(data) > LogTailBytes {
		data = data[len(data)-LogTailBytes:]
		for len(data) > 0 && !utf8.RuneStart(data[0]) {
			data = data[1:]
		}
		a.Cut = true
	}
	a.Text = string(data)
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
	follow := r.URL.Query().Get("follow") == "1"
	if h.cfg.Logs == nil {
		h.errorPage(w, r, http.StatusNotFound, ErrNoLog.Error())
		return
	}
	// A followed log ends with the attempt, or when the gateway stops.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(h.life, cancel)()
	rc, err := h.cfg.Logs.OpenLog(ctx, st, n, follow)
	if err != nil {
		h.errorPage(w, r, http.StatusNotFound, ErrNoLog.Error())
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !follow {
		_, _ = io.Copy(w, rc)
		return
	}
	// The server's write timeout is for ordinary answers; a followed log
	// lasts as long as the attempt.
	rcon := http.NewResponseController(w)
	_ = rcon.SetWriteDeadline(time.Time{})
	w.Header().Set("X-Accel-Buffering", "no") // nginx: pass each chunk on at once
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 32<<10)
	for {
		k, err := rc.Read(buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return
			}
			_ = rcon.Flush()
		}
		if err != nil {
			return
		}
	}
}
