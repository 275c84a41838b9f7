package trigger

import (
	"fmt"
	"time"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// PlaneAgent decides on one delivery of a Plane agent app (a project with
// plane_agent_app): a person's prompt on a run (the mention that started
// it, or a reply in its thread) queues respond with the prompt's words;
// a run Plane created with no comment (the agent assigned) queues
// implement; a prompt with the signal stop cancels the task's open jobs.
// A run created from a comment is left to its prompt, which carries the
// words. name is the work item's readable name, as for PlaneNamed.
func PlaneAgent(reg *registry.Registry, delivery string, body []byte, now time.Time, name string) (Decision, error) {
	ev, err := webhook.ParsePlaneAgent(body)
	if err != nil {
		return Decision{}, err
	}
	p, ok := reg.ByPlaneProject(ev.Project())
	switch {
	case !ok:
		return Ignore("unknown plane project %q", ev.Project()), nil
	case !p.PlaneAgentApp:
		return Ignore("project %q has no plane_agent_app", p.Key), nil
	case ev.Item() == "":
		return Ignore("agent run %s is on no work item", ev.RunID()), nil
	}
	pc := planeCtx{p: p, ev: &webhook.PlaneEvent{PlaneEventBody: webhook.PlaneEventBody{Event: ev.Type, Action: ev.Action}},
		delivery: delivery, now: now, name: name}
	item, run := ev.Item(), ev.RunID()
	task := proto.Task{ID: pc.taskName(item), PlaneItem: item, PlaneRun: run}
	if ev.Type == webhook.PlaneAgentRunType {
		if ev.Action != "created" {
			return Ignore("agent run action %q is not acted on", ev.Action), nil
		}
		if cmpOr(ev.CommentID, ev.Run.Comment) != "" {
			return Ignore("agent run %s started from a comment: its prompt queues the job", run), nil
		}
		actor := webhook.PlaneActor{ID: ev.Run.Creator}
		return pc.implement(actor, task, fmt.Sprintf("plane-run|%s", run)), nil
	}
	a := ev.Activity
	if a.Type != "prompt" {
		return Ignore("agent run activity of type %q is not acted on", a.Type), nil
	}
	actor := webhook.PlaneActor{ID: a.Actor}
	if a.Signal == webhook.PlaneSignalStop {
		// Anyone who may comment on the item may stop its run, in Plane
		// as here: stopping hands the agent no words.
		return Decision{Cancel: &Cancel{Project: p.Key, Task: TaskID(task.ID), Reason: "agent run " + run + " stopped in plane"}}, nil
	}
	if pc.isAgent(actor.ID) {
		return Ignore("prompt by the agent's own member"), nil
	}
	if !pc.trusted(actor) {
		return untrusted(actorName(actor)), nil
	}
	text := stripHTML(a.Content.Body)
	job := newJob(p, proto.KindRespond, fmt.Sprintf("plane-run|%s|%s", run, cmpOr(a.ID, delivery)), task, pc.source(actor), now)
	job.Source.Event = ev.Type + "/" + ev.Action
	job.Trigger = truncate(text, MaxTriggerText)
	return Decision{Jobs: []proto.Job{job}}, nil
}
