package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/trigger"
)

// MaxRequestBytes bounds the body of POST /jobs.
const MaxRequestBytes = 1 << 20

// EnqueueRequest is the body of POST /jobs.
type EnqueueRequest struct {
	Project string     `json:"project"`
	Kind    proto.Kind `json:"kind"`
	Task    proto.Task `json:"task"`
	// Trigger is the instruction for the agent, if any.
	Trigger string `json:"trigger,omitempty"`
	// Key, when given, makes the request idempotent: the same key names
	// the same job. Without it every request makes a new job.
	Key string `json:"key,omitempty"`
	// Actor is who asked, for the record.
	Actor string `json:"actor,omitempty"`
}

// JobChange is the answer of cancel and retry.
type JobChange struct {
	Job   JobRef      `json:"job"`
	State proto.State `json:"state"`
	// RetryOf names the dead-lettered job a retry re-runs.
	RetryOf string `json:"retry_of,omitempty"`
}

func (s *Server) enqueue(w http.ResponseWriter, r *http.Request) {
	var req EnqueueRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, MaxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "decoding request: "+err.Error())
		return
	}
	p, ok := s.Registry().ByKey(req.Project)
	if !ok {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown project %q", req.Project))
		return
	}
	if !req.Kind.Valid() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown kind %q", req.Kind))
		return
	}
	if req.Task.ID == "" {
		writeError(w, http.StatusBadRequest, "task.id is required")
		return
	}
	key := req.Key
	if key == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		key = hex.EncodeToString(b[:])
	}
	req.Task.ID = trigger.TaskID(req.Task.ID)
	job := proto.Job{
		Schema:    proto.SchemaVersion,
		ID:        proto.JobID(p.Key + "|" + string(req.Kind) + "|api|" + key),
		Kind:      req.Kind,
		Project:   p.Key,
		Task:      req.Task,
		Source:    proto.Source{System: "api", Event: "enqueue", Actor: req.Actor},
		CreatedAt: s.nowUTC(),
		Trigger:   req.Trigger,
	}
	s.queueOne(w, r, &job)
}

// queueOne publishes a job for a write endpoint. Unlike a webhook, the
// caller can try again, so nothing is spooled: 503 when JetStream is away.
func (s *Server) queueOne(w http.ResponseWriter, r *http.Request, job *proto.Job) {
	dup, err := s.publishOne(r.Context(), job)
	if err != nil {
		writeActionError(w, err)
		return
	}
	ref := refOf(job)
	ref.Duplicate = dup
	writeJSON(w, http.StatusAccepted, Accepted{Jobs: []JobRef{ref}})
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	jobAction(w, r, s.Cancel, func(c *JobChange) (int, any) { return http.StatusOK, c })
}

func (s *Server) retry(w http.ResponseWriter, r *http.Request) {
	jobAction(w, r, s.Retry, func(c *JobChange) (int, any) {
		return http.StatusAccepted, Accepted{Jobs: []JobRef{c.Job}}
	})
}

// jobAction runs act on the job the path names and answers with what
// answer makes of its change, or with act's error.
func jobAction(w http.ResponseWriter, r *http.Request, act func(ctx context.Context, id string) (*JobChange, error), answer func(*JobChange) (int, any)) {
	id, ok := jobID(w, r)
	if !ok {
		return
	}
	change, err := act(r.Context(), id)
	if err != nil {
		writeActionError(w, err)
		return
	}
	code, body := answer(change)
	writeJSON(w, code, body)
}
