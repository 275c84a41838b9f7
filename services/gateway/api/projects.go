package api

import (
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/orch-dev/orch/services/gateway/jobs"
)

// PauseRequest is the optional body of POST /projects/{key}/pause: who
// pauses and why, kept with the pause and shown beside it.
type PauseRequest struct {
	By   string `json:"by,omitempty"`
	Note string `json:"note,omitempty"`
}

// ProjectChange is the answer of a pause or a resume.
type ProjectChange = jobs.ProjectChange

// pauseProject answers POST /projects/{key}/pause: the project's queued
// jobs are held until POST /projects/{key}/resume.
func (s *Server) pauseProject(w http.ResponseWriter, r *http.Request) {
	var req PauseRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, MaxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "decoding request: "+err.Error())
		return
	}
	change, err := s.Jobs.Pause(r.Context(), mux.Vars(r)["key"], cmp.Or(req.By, "api"), req.Note)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	writeJSON(w, http.StatusOK, change)
}

// resumeProject answers POST /projects/{key}/resume.
func (s *Server) resumeProject(w http.ResponseWriter, r *http.Request) {
	change, err := s.Jobs.Resume(r.Context(), mux.Vars(r)["key"])
	if err != nil {
		writeRefusal(w, err)
		return
	}
	writeJSON(w, http.StatusOK, change)
}
