package trackertest

import (
	"net/http"
	"slices"
	"time"
)

// PlaneRun is an agent run the fake Plane holds (Plane's Agents API, beta:
// the AgentRun model of makeplane/plane-node-sdk, src/models/AgentRun.ts).
type PlaneRun struct {
	ID, Workspace, Project, Issue string
	// Status is created, in_progress, awaiting, completed, stopping,
	// stopped, failed or stale.
	Status string
	// Activities are the agent's activities, oldest first.
	Activities []PlaneRunActivity
}

// PlaneRunActivity is one activity the agent posted on a run.
type PlaneRunActivity struct {
	Type string
	// Body is a text activity's body; Action and Parameters an action's.
	Body       string
	Action     string
	Parameters map[string]string
	Signal     string
	At         time.Time
}

// agentRoutes adds the agent-run routes of Plane's API: the run, and its
// activities (list, create), for the app's bot token only.
func (p *Plane) agentRoutes(mux *http.ServeMux) {
	const run = "/api/v1/workspaces/{slug}/runs/{run}/"
	bearer := func(method, pattern string, h func(http.ResponseWriter, *http.Request, *PlaneRun)) {
		mux.HandleFunc(method+" "+pattern, func(w http.ResponseWriter, r *http.Request) {
			auth := r.Header.Get("Authorization")
			ft := p.note(r, pattern, auth)
			if auth != "Bearer "+p.BotToken {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "Authentication credentials were not provided."})
				return
			}
			answer(w, r, ft, func(w http.ResponseWriter, r *http.Request) {
				p.mu.Lock()
				defer p.mu.Unlock()
				rn, ok := p.runs[r.PathValue("run")]
				if !ok || rn.Workspace != r.PathValue("slug") {
					writeJSON(w, http.StatusNotFound, planeMsg(planeNotFound))
					return
				}
				h(w, r, rn)
			}, planeMsg)
		})
	}
	bearer("GET", run, func(w http.ResponseWriter, _ *http.Request, rn *PlaneRun) { writeJSON(w, http.StatusOK, runJSON(rn)) })
	bearer("GET", run+"activities/", func(w http.ResponseWriter, _ *http.Request, rn *PlaneRun) {
		out := []any{}
		for _, a := range rn.Activities {
			out = append(out, activityJSON(rn, a))
		}
		writeJSON(w, http.StatusOK, map[string]any{"results": out, "next_page_results": false})
	})
	bearer("POST", run+"activities/", p.createActivity)
}

// AddRun makes an agent run exist, as Plane creates one when a person
// mentions or assigns the agent: status created, no activity yet.
func (p *Plane) AddRun(workspace, run, project, issue string) {
	p.mu.Lock()
	p.runs[run] = &PlaneRun{ID: run, Workspace: workspace, Project: project, Issue: issue, Status: "created"}
	p.mu.Unlock()
}

// StopRun records that a person asked the run to stop (status stopping),
// as Plane does before it sends the agent a prompt with signal stop; the
// agent's next response settles it as stopped.
func (p *Plane) StopRun(run string) {
	p.mu.Lock()
	if rn, ok := p.runs[run]; ok {
		rn.Status = "stopping"
	}
	p.mu.Unlock()
}

// Run returns a copy of an agent run.
func (p *Plane) Run(run string) (PlaneRun, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rn, ok := p.runs[run]
	if !ok {
		return PlaneRun{}, false
	}
	c := *rn
	c.Activities = slices.Clone(rn.Activities)
	return c, true
}

var agentActivityTypes = []string{"thought", "action", "response", "elicitation", "error"}

// createActivity takes an activity of the run's agent. The body is
// CreateAgentRunActivityRequest: type, content {type, body} or, for an
// action, content {type, action, parameters}, optional signal. Each type
// moves the run's status as Plane's docs say: thought and action to
// in_progress, response to completed (stopped once a stop was asked),
// elicitation to awaiting, error to failed.
func (p *Plane) createActivity(w http.ResponseWriter, r *http.Request, rn *PlaneRun) {
	var b struct {
		Type    string `json:"type"`
		Signal  string `json:"signal"`
		Content struct {
			Type       string            `json:"type"`
			Body       string            `json:"body"`
			Action     string            `json:"action"`
			Parameters map[string]string `json:"parameters"`
		} `json:"content"`
	}
	if err := decode(r, &b); err != nil {
		writeJSON(w, http.StatusBadRequest, planeMsg("Invalid JSON"))
		return
	}
	switch {
	case !slices.Contains(agentActivityTypes, b.Type):
		writeJSON(w, http.StatusBadRequest, map[string]any{"type": []string{`"` + b.Type + `" is not a valid choice.`}})
		return
	case b.Content.Type != b.Type:
		writeJSON(w, http.StatusBadRequest, planeMsg("content.type must match type"))
		return
	case b.Type == "action" && b.Content.Action == "":
		writeJSON(w, http.StatusBadRequest, planeMsg("content.action is required for an action"))
		return
	case b.Type != "action" && b.Content.Body == "":
		writeJSON(w, http.StatusBadRequest, planeMsg("content.body is required"))
		return
	}
	a := PlaneRunActivity{Type: b.Type, Body: b.Content.Body, Action: b.Content.Action, Parameters: b.Content.Parameters,
		Signal: cmpOr(b.Signal, "continue"), At: time.Now()}
	rn.Activities = append(rn.Activities, a)
	switch b.Type {
	case "thought", "action":
		if rn.Status == "created" || rn.Status == "awaiting" {
			rn.Status = "in_progress"
		}
	case "response":
		if rn.Status == "stopping" {
			rn.Status = "stopped"
		} else {
			rn.Status = "completed"
		}
	case "elicitation":
		rn.Status = "awaiting"
	case "error":
		rn.Status = "failed"
	}
	writeJSON(w, http.StatusCreated, activityJSON(rn, a))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func runJSON(rn *PlaneRun) any {
	return map[string]any{"id": rn.ID, "status": rn.Status, "issue": rn.Issue, "project": rn.Project,
		"workspace": rn.Workspace, "type": "comment_thread"}
}

func activityJSON(rn *PlaneRun, a PlaneRunActivity) any {
	content := map[string]any{"type": a.Type}
	if a.Type == "action" {
		content["action"], content["parameters"] = a.Action, a.Parameters
	} else {
		content["body"] = a.Body
	}
	return map[string]any{"agent_run": rn.ID, "type": a.Type, "content": content, "signal": a.Signal,
		"ephemeral": a.Type == "thought" || a.Type == "action" || a.Type == "error", "project": rn.Project}
}
