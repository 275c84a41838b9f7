package api

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"regexp"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/services/gateway/jobs"
)

// HeaderRequestID carries the request id: taken from the request when it
// is a sane token, made up otherwise, and always sent back in the answer.
const HeaderRequestID = "X-Request-Id"

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// logFrom is the request's logger: every line carries its request id.
func logFrom(r *http.Request) *zap.Logger {
	if l := jobs.LogFrom(r.Context()); l != nil {
		return l
	}
	return zap.NewNop()
}

// statusWriter remembers the answer's status code for the access log.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer, so
// streamed answers can flush and lift the write deadline.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// WithRequestID gives every request an id, a logger carrying it (in its
// context, see jobs.WithLog), and one access log line on log. The gateway
// wraps both its faces in it.
func WithRequestID(log *zap.Logger, next http.Handler) http.Handler {
	base := log
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if !requestIDPattern.MatchString(id) {
			id = newRequestID()
		}
		w.Header().Set(HeaderRequestID, id)
		log := base.With(zap.String("request_id", id))
		r = r.WithContext(jobs.WithLog(r.Context(), log))
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		next.ServeHTTP(sw, r)
		lvl := log.Debug // polling GETs would drown the log
		if r.Method != http.MethodGet {
			lvl = log.Info
		}
		if sw.code >= 500 {
			lvl = log.Warn
		}
		lvl("http request", zap.String("method", r.Method), zap.String("path", loggedPath(r.URL.Path)),
			zap.Int("status", sw.code), zap.Duration("took", time.Since(start)))
	})
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
