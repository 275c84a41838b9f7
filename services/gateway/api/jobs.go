package api

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/orch-dev/orch/services/gateway/jobs"
)

// MaxRequestBytes bounds the body of POST /jobs.
const MaxRequestBytes = 1 << 20

// EnqueueRequest is the body of POST /jobs.
type EnqueueRequest = jobs.Request

// JobChange is the answer of cancel.
type JobChange = jobs.Change

// enqueue answers POST /jobs. Unlike a webhook, the caller can try again,
// so nothing is spooled: 503 when JetStream is away.
func (s *Server) enqueue(w http.ResponseWriter, r *http.Request) {
	var req EnqueueRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, MaxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "decoding request: "+err.Error())
		return
	}
	ref, err := s.Jobs.Enqueue(r.Context(), req)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, Accepted{Jobs: []JobRef{ref}})
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	change, err := s.Jobs.Cancel(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeRefusal(w, err)
		return
	}
	writeJSON(w, http.StatusOK, change)
}

func (s *Server) retry(w http.ResponseWriter, r *http.Request) {
	change, err := s.Jobs.Retry(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeRefusal(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, Accepted{Jobs: []JobRef{change.Job}})
}

// release answers POST /jobs/{id}/release: a held job runs now.
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	change, err := s.Jobs.Release(r.Context(), mux.Vars(r)["id"], "api")
	if err != nil {
		writeRefusal(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, change)
}
