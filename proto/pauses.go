package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketPauses is the KV bucket of pauses: while a key is there (and,
// where it names one, its Until has not passed), no runner starts a job
// the pause covers; such a job is recorded held instead (see
// StateHeld) and runs by itself when the pause ends. The keys:
//
//   - "project.<project key>": an operator paused the project
//     (ProjectPauseKey); held with HoldOperator until the key is deleted.
//   - "usage.<credential id>": an agent met its account's usage limit
//     (UsagePauseKey); held with HoldUsageLimit until Until. The
//     credential id is CredentialID of the model credential, never the
//     credential.
//
// The value is a Pause in JSON. A pause is ended by deleting its key (a
// usage pause also ends by itself at Until; the runners delete it then).
const BucketPauses = "pauses"

// Pause key prefixes: the first token of a key in BucketPauses.
const (
	PauseProjectPrefix = "project."
	PauseUsagePrefix   = "usage."
)

// ProjectPauseKey is the key of an operator's pause of project.
func ProjectPauseKey(project string) string { return PauseProjectPrefix + project }

// UsagePauseKey is the key of a usage-limit pause of the credential whose
// CredentialID is credID.
func UsagePauseKey(credID string) string { return PauseUsagePrefix + credID }

// CredentialID names a model credential (an API key or an OAuth token)
// without revealing it: the first 12 hex digits of its SHA-256. Empty for
// an empty credential: "default", the login of the runner's own user.
func CredentialID(credential string) string {
	if credential == "" {
		return "default"
	}
	sum := sha256.Sum256([]byte(credential))
	return hex.EncodeToString(sum[:6])
}

// Pause is the value of a key in BucketPauses.
type Pause struct {
	Schema int `json:"schema"`
	// Reason is the hold reason of the jobs it holds: HoldOperator or
	// HoldUsageLimit.
	Reason string `json:"reason"`
	// Since is when the pause began; Until when it ends by itself (zero:
	// when its key is deleted).
	Since time.Time `json:"since"`
	Until time.Time `json:"until,omitzero"`
	// By names who paused: the operator's name, or the runner that met the
	// limit.
	By string `json:"by,omitempty"`
	// Job is the job that met a usage limit; Note what the agent said
	// (scrubbed) or the operator's words.
	Job  string `json:"job,omitempty"`
	Note string `json:"note,omitempty"`
}

// Active reports whether the pause still holds at now.
func (p *Pause) Active(now time.Time) bool { return p.Until.IsZero() || now.Before(p.Until) }

// DecodePause parses a value of BucketPauses.
func DecodePause(data []byte) (*Pause, error) {
	var p Pause
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("decoding pause: %w", err)
	}
	return &p, nil
}

// PausesBucket is the configuration of BucketPauses: no TTL, as an
// operator's pause lasts until it is lifted.
func (t Topology) PausesBucket() jetstream.KeyValueConfig {
	return t.bucket(BucketPauses, "orch pauses: projects paused by an operator, credentials at their usage limit", 0)
}
