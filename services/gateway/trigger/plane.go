package trigger

import (
	"fmt"
	"html"
	"regexp"
	"strconv"
	"time"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// PlaneCancelledGroup is the state group whose states cancel a task.
const PlaneCancelledGroup = "cancelled"

// Plane decides on one Plane delivery. eventHeader is X-Plane-Event,
// delivery is X-Plane-Delivery.
func Plane(reg *registry.Registry, eventHeader, delivery string, body []byte, now time.Time) (Decision, error) {
	ev, err := webhook.ParsePlane(eventHeader, body)
	if err != nil {
		return Decision{}, err
	}
	var project string
	switch {
	case ev.Issue != nil:
		project = ev.Issue.Project
	case ev.Comment != nil:
		project = ev.Comment.Project
	default:
		return Ignore("plane event %q is not acted on", ev.Event), nil
	}
	p, ok := reg.ByPlaneProject(project)
	if !ok {
		return Ignore("unknown plane project %q", project), nil
	}
	pc := planeCtx{p: p, ev: ev, delivery: delivery, now: now}
	if ev.Issue != nil {
		return pc.issue(), nil
	}
	return pc.comment(), nil
}

type planeCtx struct {
	p        *registry.Project
	ev       *webhook.PlaneEvent
	delivery string
	now      time.Time
}

func (pc planeCtx) source(actor string) proto.Source {
	return proto.Source{System: "plane", Event: pc.ev.Event + "/" + pc.ev.Action, Delivery: pc.delivery, Actor: actor}
}

// actor is the Plane member who made the change: the activity's actor, or
// the item's last editor.
func (pc planeCtx) actor(fallback string) webhook.PlaneActor {
	a := pc.ev.Activity.Actor
	if a.ID == "" {
		a.ID = fallback
	}
	return a
}

func (pc planeCtx) trusted(a webhook.PlaneActor) bool {
	return pc.p.Trusts(a.ID, a.Email, a.DisplayName)
}

func actorName(a webhook.PlaneActor) string {
	return cmpOr(a.Email, cmpOr(a.DisplayName, a.ID))
}

// planeTask is the task of a work item: <identifier>-<sequence> where the
// payload names the project identifier, else the item id.
func planeTask(is *webhook.PlaneIssue) proto.Task {
	id := is.ID
	if ident := is.Identifier(); ident != "" && is.SequenceID > 0 {
		id = ident + "-" + strconv.Itoa(is.SequenceID)
	}
	body := is.DescriptionStripped
	if body == "" {
		body = stripHTML(is.DescriptionHTML)
	}
	return proto.Task{ID: id, Title: is.Name, Body: body, PlaneItem: is.ID}
}

func (pc planeCtx) issue() Decision {
	is := pc.ev.Issue
	actor := pc.actor(cmpOr(is.UpdatedBy, is.CreatedBy))
	task := planeTask(is)
	labels := pc.labelKeys(is)
	switch pc.ev.Action {
	case "created":
		hasLabel, assigned := setHasAny(refSet(is.Labels, is.LabelIDs), labels), pc.agentIn(refSet(is.Assignees, is.AssigneeIDs))
		if !hasLabel && !assigned {
			return Ignore("work item has neither the label %q nor the agent assigned", pc.p.Label)
		}
		// Assigning the agent member is itself a deliberate act; only the
		// label (anyone may add one) asks for a trusted actor.
		return pc.implement(actor, task, fmt.Sprintf("plane|%s|created", is.ID), hasLabel)
	case "updated":
	default:
		return Ignore("work item action %q is not acted on", pc.ev.Action)
	}
	act := pc.ev.Activity
	newV, oldV := webhook.Values(act.NewValue), webhook.Values(act.OldValue)
	switch act.Field {
	case "label_ids", "labels":
		has := func(set map[string]bool) bool { return setHasAny(set, labels) }
		if !newly(has(refSet(is.Labels, is.LabelIDs)), oldV, newV, webhook.Values(act.NewIdentifier), has) {
			return Ignore("label update does not newly add %q", pc.p.Label)
		}
		return pc.implement(actor, task, fmt.Sprintf("plane|%s|labels|%s|%s", is.ID, pc.p.Label, is.UpdatedAt), true)
	case "assignee_ids", "assignees":
		if pc.p.PlaneAgentMember == "" {
			return Ignore("project %q has no plane_agent_member", pc.p.Key)
		}
		if !newly(pc.agentIn(refSet(is.Assignees, is.AssigneeIDs)), oldV, newV, webhook.Values(act.NewIdentifier), pc.agentIn) {
			return Ignore("assignee update does not newly assign the agent")
		}
		return pc.implement(actor, task, fmt.Sprintf("plane|%s|assignees|%s|%s", is.ID, pc.p.PlaneAgentMember, is.UpdatedAt), false)
	case "state_id", "state":
		st := is.StateDetail
		if st == nil || st.Group == "" {
			st = is.State
		}
		if st == nil || st.Group == "" {
			return Ignore("work item state has no group in the payload")
		}
		if st.Group != PlaneCancelledGroup {
			return Ignore("work item moved to state group %q", st.Group)
		}
		return Decision{Cancel: &Cancel{Project: pc.p.Key, Task: TaskID(task.ID), Reason: "work item cancelled in plane"}}
	}
	return Ignore("work item field %q is not acted on", act.Field)
}

// implement queues an implement job; label triggers need a trusted actor,
// as PRODUCT.md says of label and mention triggers.
func (pc planeCtx) implement(actor webhook.PlaneActor, task proto.Task, key string, needTrust bool) Decision {
	if pc.p.PlaneAgentMember != "" && actor.ID == pc.p.PlaneAgentMember {
		return Ignore("change by the agent's own member")
	}
	if needTrust && !pc.trusted(actor) {
		return Ignore("actor %q is not trusted", actorName(actor))
	}
	return Decision{Jobs: []proto.Job{newJob(pc.p, proto.KindImplement, key, task, pc.source(actorName(actor)), pc.now)}}
}

func (pc planeCtx) comment() Decision {
	c := pc.ev.Comment
	if pc.ev.Action != "created" {
		return Ignore("comment action %q is not acted on", pc.ev.Action)
	}
	actor := pc.actor(cmpOr(c.Actor, c.CreatedBy))
	if pc.p.PlaneAgentMember != "" && (actor.ID == pc.p.PlaneAgentMember || c.Actor == pc.p.PlaneAgentMember) {
		return Ignore("comment by the agent's own member")
	}
	if c.ExternalSource == proto.PlaneExternalSource {
		return Ignore("comment is orch's own tracking comment")
	}
	text := c.CommentStripped
	if text == "" {
		text = stripHTML(c.CommentHTML)
	}
	if !Mentions(text, pc.p.Mention) {
		return Ignore("comment does not mention %s", pc.p.Mention)
	}
	if !pc.trusted(actor) {
		return Ignore("actor %q is not trusted", actorName(actor))
	}
	task := proto.Task{ID: c.Issue, PlaneItem: c.Issue}
	job := newJob(pc.p, proto.KindRespond, fmt.Sprintf("plane|comment|%s", c.ID), task, pc.source(actorName(actor)), pc.now)
	job.Trigger = truncate(text, MaxTriggerText)
	return Decision{Jobs: []proto.Job{job}}
}

// newly reports whether an update made a condition true: it holds now,
// did not before, and the update's new value names it. When the activity
// names neither value the item as it is now decides.
func newly(now bool, oldV, newV, newIdent map[string]bool, has func(map[string]bool) bool) bool {
	switch {
	case !now || has(oldV):
		return false
	case has(newV) || has(newIdent):
		return true
	}
	return len(newV) == 0 && len(oldV) == 0
}

// labelKeys are the ways a payload may name the trigger label: its name,
// and the id of the item's label of that name.
func (pc planeCtx) labelKeys(is *webhook.PlaneIssue) []string {
	keys := []string{pc.p.Label}
	for _, l := range is.Labels {
		if l.Name == pc.p.Label && l.ID != "" {
			keys = append(keys, l.ID)
		}
	}
	return keys
}

func (pc planeCtx) agentIn(set map[string]bool) bool {
	return pc.p.PlaneAgentMember != "" && set[pc.p.PlaneAgentMember]
}

func refSet(refs []webhook.PlaneRef, ids []string) map[string]bool {
	out := map[string]bool{}
	for _, r := range refs {
		for _, s := range []string{r.ID, r.Name} {
			if s != "" {
				out[s] = true
			}
		}
	}
	for _, id := range ids {
		out[id] = true
	}
	return out
}

func setHasAny(set map[string]bool, keys []string) bool {
	for _, k := range keys {
		if k != "" && set[k] {
			return true
		}
	}
	return false
}

var tags = regexp.MustCompile(`<[^>]*>`)

// stripHTML turns Plane's comment HTML into plain text for mention
// matching and the job's trigger text.
func stripHTML(s string) string {
	return html.UnescapeString(tags.ReplaceAllString(s, " "))
}
