// Package trackertest gives tests fake Gitea and Plane API servers on
// httptest: the real paths, methods, auth headers and error answers
// (401, 404 for a deleted pull request or work item, 409, 422, 429 with
// Retry-After, 5xx), with what each fake holds readable from the test.
// Any module's tests may use them; only the outside APIs are faked.
package trackertest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Fault is an answer a test forces on a request instead of the fake's own.
type Fault struct {
	// Code is the HTTP status, e.g. 429 or 503.
	Code int
	// RetryAfter, when set, is sent as the Retry-After header in seconds.
	RetryAfter time.Duration
	// Body is the answer's body; a JSON error message when empty.
	Body string
	// After, when true, lets the request take effect first and then
	// answers with the fault: an answer lost on the way back.
	After bool
}

// FaultFunc picks a fault for a request, or nil to answer normally. n
// counts the requests of the same method and route pattern, from 1.
type FaultFunc func(r *http.Request, route string, n int) *Fault

// Request is one request a fake received.
type Request struct {
	Method, Path, Route string
	// Auth is the credential header as sent (Authorization or X-API-Key).
	Auth string
	At   time.Time
}

// faults is the fault injection and request log both fakes share.
type faults struct {
	mu     sync.Mutex
	fault  FaultFunc
	counts map[string]int
	reqs   []Request
}

// SetFault installs f for the requests from now on; nil removes it.
func (f *faults) SetFault(fn FaultFunc) {
	f.mu.Lock()
	f.fault = fn
	f.mu.Unlock()
}

// Requests returns every request received so far.
func (f *faults) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.reqs...)
}

// note logs r under route and returns the fault to answer with, if any.
func (f *faults) note(r *http.Request, route, auth string) *Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	key := r.Method + " " + route
	f.counts[key]++
	f.reqs = append(f.reqs, Request{Method: r.Method, Path: r.URL.Path, Route: route, Auth: auth, At: time.Now()})
	if f.fault == nil {
		return nil
	}
	return f.fault(r, route, f.counts[key])
}

// answer serves r with h, or with ft where a test forced a fault: instead
// of h, or (After) once h has taken effect, its own answer dropped. msg
// shapes the error body as the tracker does.
func answer(w http.ResponseWriter, r *http.Request, ft *Fault, h func(http.ResponseWriter, *http.Request), msg func(string) any) {
	if ft == nil {
		h(w, r)
		return
	}
	if ft.After {
		h(&recorder{header: http.Header{}}, r)
	}
	writeFault(w, ft, msg)
}

// writeFault answers with ft.
func writeFault(w http.ResponseWriter, ft *Fault, msg func(string) any) {
	if ft.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((ft.RetryAfter+time.Second-1)/time.Second)))
	}
	if ft.Body != "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ft.Code)
		_, _ = w.Write([]byte(ft.Body))
		return
	}
	writeJSON(w, ft.Code, msg(http.StatusText(ft.Code)))
}

// decode reads r's JSON body into v.
func decode(r *http.Request, v any) error { return json.NewDecoder(r.Body).Decode(v) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// recorder captures an answer so that a fault with After can replace it.
type recorder struct {
	header http.Header
	code   int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(code int)        { r.code = code }
