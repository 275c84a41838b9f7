package writeback

import (
	"errors"
)

// Trackers, operations and outcomes of a write, the label values of the
// notifier's write-back metrics. Every write is counted under exactly one
// of each, so the series are bounded and known in advance.
const (
	TrackerGitea = "gitea"
	TrackerPlane = "plane"

	// OpComment is a tracking comment created or edited (and the search
	// for it before a create, when that fails); OpStatus a commit status
	// set (and the pull request's head looked up for it, when that fails).
	OpComment = "comment"
	OpStatus  = "status"
	// OpRun is an activity posted on a Plane agent run.
	OpRun = "run"

	// OutcomeOK: the tracker took it. OutcomeRetry: it failed in a way
	// that may pass (5xx, 408, 429, network) and is tried again after a
	// backoff. OutcomeGone: 404, the pull request, work item or comment no
	// longer exists; the job's write-back stops. OutcomeRejected: any other
	// 4xx (401, 403, 422), which needs a person (token, permissions).
	OutcomeOK       = "ok"
	OutcomeRetry    = "retry"
	OutcomeGone     = "gone"
	OutcomeRejected = "rejected"
)

// Trackers, Operations and Outcomes list every label value, for a
// recorder that creates its series up front.
var (
	Trackers   = []string{TrackerGitea, TrackerPlane}
	Operations = []string{OpComment, OpStatus, OpRun}
	Outcomes   = []string{OutcomeOK, OutcomeRetry, OutcomeGone, OutcomeRejected}
)

// Recorder counts the writes to the trackers. The notifier's metrics
// implement it; a nil Recorder in Config counts nothing.
type Recorder interface {
	Wrote(tracker, op, outcome string)
}

// outcomeOf classifies a request's error as the write-back acts on it.
func outcomeOf(err error) string {
	var apiErr *APIError
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, ErrGone):
		return OutcomeGone
	case errors.As(err, &apiErr) && !apiErr.Retryable():
		return OutcomeRejected
	}
	return OutcomeRetry
}

// count records one request to tracker for op that ended with err.
func (w *Writer) count(tracker, op string, err error) {
	if w.cfg.Recorder != nil {
		w.cfg.Recorder.Wrote(tracker, op, outcomeOf(err))
	}
}

// Pending is how many jobs this notifier has something left to write
// for: a comment or status not yet written, waiting for its coalescing
// delay, its backoff after a failure, or another notifier's lease.
func (w *Writer) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}
