package proto

import (
	"encoding/json"
	"fmt"
	"time"
)

// State is where a job is in its life.
type State string

// The states of a job. Done, Failed and Cancelled are terminal. Held is a
// job that may not start yet (its project's budget is spent, its
// credential is at its usage limit, or an operator paused its project):
// it has no message in StreamJobs, only its record, and is published again
// when the hold ends (see HoldReason).
const (
	StateQueued    State = "queued"
	StateHeld      State = "held"
	StateRunning   State = "running"
	StateRetrying  State = "retrying"
	StateDone      State = "done"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
)

// States lists every state, in the order of a job's life.
var States = []State{StateQueued, StateHeld, StateRunning, StateRetrying, StateDone, StateFailed, StateCancelled}

// The reasons a job is held (Status.HeldReason).
const (
	// HoldOverBudget: the project's daily or monthly budget is spent;
	// the job runs when the window rolls over or the budget is raised.
	HoldOverBudget = "over_budget"
	// HoldUsageLimit: the model account's usage limit was met; the job
	// runs at Status.HeldUntil, the limit's reset.
	HoldUsageLimit = "usage_limit"
	// HoldOperator: an operator paused the job's project; the job runs
	// when the project is resumed.
	HoldOperator = "operator"
)

// ReasonSuperseded is the error of a job cancelled because a newer job of
// the same task and kind was queued (Status.SupersededBy names it): no
// alert, as for any cancel.
const ReasonSuperseded = "superseded"

// HoldReasons lists the hold reasons.
var HoldReasons = []string{HoldOverBudget, HoldUsageLimit, HoldOperator}

// HeldMsgID is the Nats-Msg-Id of a held job's message when it is
// published again after its hold number seq ends: a new id per hold, as
// the duplicate window would drop the job's own id.
func HeldMsgID(jobID string, seq int) string { return fmt.Sprintf("%s.held.%d", jobID, seq) }

// Terminal reports whether no further work happens in state s.
func (s State) Terminal() bool {
	return s == StateDone || s == StateFailed || s == StateCancelled
}

// Status is a job's status record, the value under the job id in the KV
// bucket BucketJobs. It carries the job itself, so that a job removed from
// StreamJobs (acked, or terminated) can still be shown and alerted on.
type Status struct {
	Schema      int       `json:"schema"`
	Job         Job       `json:"job"`
	State       State     `json:"state"`
	Attempt     int       `json:"attempt"`
	MaxAttempts int       `json:"max_attempts"`
	Runner      string    `json:"runner,omitempty"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	FinishedAt  time.Time `json:"finished_at,omitzero"`
	UpdatedAt   time.Time `json:"updated_at"`
	ExitCode    *int      `json:"exit_code,omitempty"`
	Error       string    `json:"error,omitempty"`
	// Log is the path of the attempt's agent log on the runner's host.
	Log string `json:"log,omitempty"`
	// CostUSD and Turns are what the agent reported, where it did. While
	// the agent runs they are its progress so far, updated every few
	// seconds (Claude Code reports its cost only at the end).
	CostUSD float64 `json:"cost_usd,omitempty"`
	Turns   int     `json:"turns,omitempty"`
	// SpentUSD is the cost of every attempt that ended with a report,
	// summed: what the job cost so far, where CostUSD is its latest
	// attempt's.
	SpentUSD float64 `json:"spent_usd,omitempty"`
	// LastActivity is when the agent last printed something, updated
	// with the progress while it runs.
	LastActivity time.Time `json:"last_activity,omitzero"`
	// SessionID is the agent's own session id, where it reported one.
	SessionID string `json:"session_id,omitempty"`
	// Resumed is the session the attempt's agent resumed (registry
	// session: continue), empty when it started a fresh one.
	Resumed string `json:"resumed,omitempty"`
	// Restored says what of the task's saved state (object store
	// task_state) the attempt began with and from which runner, or that
	// the state could not be read; empty when nothing was restored.
	Restored string `json:"restored,omitempty"`
	// Result is the agent's final message, where it reported one (Claude
	// Code's "result"), cut to 4 KiB; the whole text is in the log.
	Result string `json:"result,omitempty"`
	// Alerted is set by the notifier once a person was told of the failure.
	Alerted bool `json:"alerted,omitempty"`
	// DLQSeq is the job's sequence in StreamDLQ once it is dead-lettered.
	DLQSeq uint64 `json:"dlq_seq,omitempty"`
	// Sandbox is how the runner confined the attempt's agent: "bwrap"
	// (bubblewrap) or "none" (unconfined: it could read what the runner
	// can); empty in a record of a runner from before confinement.
	Sandbox string `json:"sandbox,omitempty"`
	// Network is what a confined agent could reach: "allowlist" (only the
	// job's egress proxy), "open" or "none"; empty when unconfined.
	Network string `json:"network,omitempty"`
	// Limits says how the agent's memory and process limits were applied:
	// "rlimit" or "none" (no limit set).
	Limits string `json:"limits,omitempty"`

	// HeldReason says why a held job waits (HoldOverBudget,
	// HoldUsageLimit, HoldOperator); HeldUntil when it runs by itself,
	// where that is known (a usage limit's reset, the budget window's
	// end); HeldAt since when. They stay on the record after the job is
	// released, for its page, until a later hold or the job's end.
	HeldReason string    `json:"held_reason,omitempty"`
	HeldUntil  time.Time `json:"held_until,omitzero"`
	HeldAt     time.Time `json:"held_at,omitzero"`
	// Holds counts the job's holds; HeldMsgID(job, Holds) is the id its
	// message is published again with.
	Holds int `json:"holds,omitempty"`
	// AttemptBase is how many attempts the job had used when its current
	// message was published (0 for its first message): a runner's attempt
	// is AttemptBase plus the message's delivery count, so a held job
	// keeps the attempts it had, and no more than MaxAttempts run in all.
	AttemptBase int `json:"attempt_base,omitempty"`
	// ReleasedBy names who released the job from its hold by hand (POST
	// /jobs/{id}/release): such a job runs over its budget.
	ReleasedBy string `json:"released_by,omitempty"`
	// SupersededBy names the newer job of the same task and kind that
	// replaced a cancelled one (its error is ReasonSuperseded).
	SupersededBy string `json:"superseded_by,omitempty"`
}

// DecodeStatus parses a status record.
func DecodeStatus(data []byte) (*Status, error) {
	var s Status
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decoding status: %w", err)
	}
	return &s, nil
}
