package proto

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Advisory types, as JetStream names them in the "type" field.
const (
	AdvisoryMaxDeliveries = "io.nats.jetstream.advisory.v1.max_deliver"
	AdvisoryTerminated    = "io.nats.jetstream.advisory.v1.terminated"
)

// ReasonCancelled is the Term reason of a cancelled job; the notifier does
// not alert on it.
const ReasonCancelled = "cancelled"

// Advisory is the part of JetStream's MAX_DELIVERIES and MSG_TERMINATED
// advisories that orch reads.
type Advisory struct {
	Type       string `json:"type"`
	ID         string `json:"id"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	// Reason is set on MSG_TERMINATED: the text given to msg.TermWithReason.
	Reason string `json:"reason,omitempty"`
}

// DecodeAdvisory parses an advisory and checks it is one orch acts on.
func DecodeAdvisory(data []byte) (*Advisory, error) {
	var a Advisory
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("decoding advisory: %w", err)
	}
	if a.Type != AdvisoryMaxDeliveries && a.Type != AdvisoryTerminated {
		return &a, fmt.Errorf("unexpected advisory type %q", a.Type)
	}
	if a.StreamSeq == 0 {
		return &a, fmt.Errorf("advisory %s has no stream sequence", a.ID)
	}
	return &a, nil
}

// TermReason is the reason a runner gives when it terminates a job that
// cannot run: the job id first, so the notifier can find the job's status
// record (Term removes the message from StreamJobs at once).
func TermReason(jobID, cause string) string {
	r := jobID + ": " + cause
	if len(r) > 240 {
		r = r[:240]
	}
	return r
}

// ParseTermReason splits a TermReason into the job id and the cause.
func ParseTermReason(reason string) (jobID, cause string) {
	id, cause, ok := strings.Cut(reason, ": ")
	if !ok || Token(id) != id {
		return "", reason
	}
	return id, cause
}
