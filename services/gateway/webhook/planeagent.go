package webhook

import (
	"encoding/json"
	"fmt"
)

// The webhooks of a Plane agent app (Plane's Agents API, beta). Plane's
// open-source server does not hold this code; the shape below is taken
// from Plane's developer documentation (makeplane/developer-docs,
// docs/dev-tools/agents/building-an-agent.md, "AgentRun webhooks", and
// signals-content-payload.md, "Signal: stop") and the models of
// makeplane/plane-node-sdk (src/models/AgentRun.ts). Checked there: the
// body's type (agent_run, agent_run_activity), action (created,
// prompted), the agent_run and agent_run_activity objects and the ids
// beside them, the activity's content {type, body} and signal (continue,
// stop, ...); the signature is X-Plane-Signature over the raw body, as
// for every Plane webhook (build-plane-app/webhooks.md). Not checked
// against a live Plane: the X-Plane-Event value of these deliveries
// (read from the body instead) and whether an assignment's run is
// followed by a prompt activity as a mention's is.

// Types of an agent app's deliveries (the body's "type").
const (
	PlaneAgentRunType      = "agent_run"
	PlaneAgentActivityType = "agent_run_activity"
)

// Signals of an agent run activity.
const (
	PlaneSignalContinue = "continue"
	PlaneSignalStop     = "stop"
)

// PlaneAgentRun is an agent run: one session between people and the
// agent on a work item's comment thread.
type PlaneAgentRun struct {
	ID        string `json:"id"`
	AgentUser string `json:"agent_user"`
	Issue     string `json:"issue"`
	Project   string `json:"project"`
	Workspace string `json:"workspace"`
	Status    string `json:"status"`
	Type      string `json:"type"`
	Creator   string `json:"creator"`
	Comment   string `json:"comment"`
}

// PlaneAgentActivity is one message of a run; a person's is a prompt.
type PlaneAgentActivity struct {
	ID       string `json:"id"`
	AgentRun string `json:"agent_run"`
	Type     string `json:"type"`
	Content  struct {
		Type string `json:"type"`
		Body string `json:"body"`
	} `json:"content"`
	Signal    string `json:"signal"`
	Actor     string `json:"actor"`
	Ephemeral bool   `json:"ephemeral"`
}

// PlaneAgentEvent is one delivery of a Plane agent app: a run created
// (Type agent_run, Action created) or a person's prompt on a run (Type
// agent_run_activity, Action prompted), the stop of a run among them.
type PlaneAgentEvent struct {
	Type        string              `json:"type"`
	Action      string              `json:"action"`
	Run         PlaneAgentRun       `json:"agent_run"`
	Activity    *PlaneAgentActivity `json:"agent_run_activity"`
	AgentUserID string              `json:"agent_user_id"`
	AppClientID string              `json:"app_client_id"`
	CommentID   string              `json:"comment_id"`
	IssueID     string              `json:"issue_id"`
	ProjectID   string              `json:"project_id"`
	WorkspaceID string              `json:"workspace_id"`
}

// RunID is the run the delivery is about.
func (e *PlaneAgentEvent) RunID() string {
	if e.Run.ID == "" && e.Activity != nil {
		return e.Activity.AgentRun
	}
	return e.Run.ID
}

// Project is the Plane project id of the run.
func (e *PlaneAgentEvent) Project() string { return cmpOr(e.ProjectID, e.Run.Project) }

// Item is the work item id of the run, empty for a run on none.
func (e *PlaneAgentEvent) Item() string { return cmpOr(e.IssueID, e.Run.Issue) }

// ParsePlaneAgent parses the body of an agent app's delivery.
func ParsePlaneAgent(body []byte) (*PlaneAgentEvent, error) {
	var ev PlaneAgentEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch ev.Type {
	case PlaneAgentRunType:
	case PlaneAgentActivityType:
		if ev.Activity == nil {
			return nil, fmt.Errorf("%w: agent_run_activity delivery without agent_run_activity", ErrMalformed)
		}
	default:
		return nil, fmt.Errorf("%w: agent app delivery of type %q, want agent_run or agent_run_activity", ErrMalformed, ev.Type)
	}
	if ev.RunID() == "" {
		return nil, fmt.Errorf("%w: agent app delivery without the run's id", ErrMalformed)
	}
	return &ev, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
