package trigger

import (
	"fmt"
	"html"
	"regexp"
	"strconv"
	"strings"
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
	return PlaneNamed(reg, eventHeader, delivery, body, now, "")
}

// PlaneNamed is Plane with the work item's readable name (e.g. WID-41,
// found through Plane's API by package planenames) as the task's name.
// Plane's webhooks carry no project identifier, so without a name the
// task is named by the item's id, unless the payload has both the
// identifier and the sequence id. The item's id stays in the job
// (Task.PlaneItem) for write-back.
func PlaneNamed(reg *registry.Registry, eventHeader, delivery string, body []byte, now time.Time, name string) (Decision, error) {
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
	pc := planeCtx{p: p, ev: ev, delivery: delivery, now: now, name: name}
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
	// name is the item's readable name, empty when not known.
	name string
}

func (pc planeCtx) source(actor webhook.PlaneActor) proto.Source {
	return proto.Source{System: "plane", Event: pc.ev.Event + "/" + pc.ev.Action, Delivery: pc.delivery, Actor: actorName(actor), Trusted: pc.trusted(actor)}
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

// trusted reports whether the project trusts a Plane member, by member
// id or e-mail. The display name is never asked: any member may set it
// to anyone's name.
func (pc planeCtx) trusted(a webhook.PlaneActor) bool {
	return pc.p.TrustsPlane(a.ID, a.Email)
}

// isAgent reports whether a member id is the agent's own member.
func (pc planeCtx) isAgent(id string) bool {
	return pc.p.PlaneAgentMember != "" && strings.EqualFold(id, pc.p.PlaneAgentMember)
}

// actorName names a member in a job's source and an ignored reason: by
// e-mail, else by id; never by display name, which proves nothing.
func actorName(a webhook.PlaneActor) string {
	return cmpOr(a.Email, a.ID)
}

// taskName is the task id of work item item: the name handed in, else
// the item's id.
func (pc planeCtx) taskName(item string) string {
	return cmpOr(pc.name, item)
}

// planeTask is the task of a work item: the name handed in, else
// <identifier>-<sequence> where the payload names the project identifier,
// else the item id. Its title and description are the creator's words.
func (pc planeCtx) planeTask(is *webhook.PlaneIssue) proto.Task {
	id := pc.taskName(is.ID)
	if ident := is.Identifier(); pc.name == "" && ident != "" && is.SequenceID > 0 {
		id = ident + "-" + strconv.Itoa(is.SequenceID)
	}
	body := is.DescriptionStripped
	if body == "" {
		body = stripHTML(is.DescriptionHTML)
	}
	return proto.Task{ID: id, Title: is.Name, Body: body, PlaneItem: is.ID,
		Author: is.CreatedBy, AuthorTrusted: pc.p.TrustsPlane(is.CreatedBy, "")}
}

func (pc planeCtx) issue() Decision {
	is := pc.ev.Issue
	actor := pc.actor(cmpOr(is.UpdatedBy, is.CreatedBy))
	task := pc.planeTask(is)
	labels := pc.labelKeys(is)
	switch pc.ev.Action {
	case "created":
		hasLabel, assigned := setHasAny(refSet(is.Labels, is.LabelIDs), labels), pc.agentIn(refSet(is.Assignees, is.AssigneeIDs))
		if !hasLabel && !assigned {
			return Ignore("work item has neither the label %q nor the agent assigned", pc.p.Label)
		}
		return pc.implement(actor, task, fmt.Sprintf("plane|%s|created", is.ID))
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
		return pc.implement(actor, task, fmt.Sprintf("plane|%s|labels|%s|%s", is.ID, pc.p.Label, is.UpdatedAt))
	case "assignee_ids", "assignees":
		if pc.p.PlaneAgentMember == "" {
			return Ignore("project %q has no plane_agent_member", pc.p.Key)
		}
		if !newly(pc.agentIn(refSet(is.Assignees, is.AssigneeIDs)), oldV, newV, webhook.Values(act.NewIdentifier), pc.agentIn) {
			return Ignore("assignee update does not newly assign the agent")
		}
		return pc.implement(actor, task, fmt.Sprintf("plane|%s|assignees|%s|%s", is.ID, pc.p.PlaneAgentMember, is.UpdatedAt))
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

// implement queues an implement job for a trusted actor. Labelling a
// work item or assigning it to the agent hands its title and description
// (anyone's words) to an agent that runs commands: the member who does
// so vouches for them, and must be trusted.
func (pc planeCtx) implement(actor webhook.PlaneActor, task proto.Task, key string) Decision {
	if pc.isAgent(actor.ID) {
		return Ignore("change by the agent's own member")
	}
	if !pc.trusted(actor) {
		return untrusted(actorName(actor))
	}
	return Decision{Jobs: []proto.Job{newJob(pc.p, proto.KindImplement, key, task, pc.source(actor), pc.now)}}
}

func (pc planeCtx) comment() Decision {
	c := pc.ev.Comment
	if pc.ev.Action != "created" {
		return Ignore("comment action %q is not acted on", pc.ev.Action)
	}
	actor := pc.actor(cmpOr(c.Actor, c.CreatedBy))
	if pc.isAgent(actor.ID) || pc.isAgent(c.Actor) {
		return Ignore("comment by the agent's own member")
	}
	if c.ExternalSource == proto.PlaneExternalSource {
		return Ignore("comment is orch's own tracking comment")
	}
	text := c.CommentStripped
	if text == "" {
		text = stripHTML(c.CommentHTML)
	}
	if !Mentions(text, pc.p.Mention) && !pc.mentionsAgentMember(c.CommentHTML) {
		if pc.p.PlaneAgentMember == "" {
			return Ignore("comment does not mention %s (and the project has no plane_agent_member an editor mention could name)", pc.p.Mention)
		}
		return Ignore("comment does not mention %s or the agent member", pc.p.Mention)
	}
	if !pc.trusted(actor) {
		return untrusted(actorName(actor))
	}
	task := proto.Task{ID: pc.taskName(c.Issue), PlaneItem: c.Issue}
	job := newJob(pc.p, proto.KindRespond, fmt.Sprintf("plane|comment|%s", c.ID), task, pc.source(actor), pc.now)
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

// mentionsAgentMember reports whether a comment's HTML mentions the
// agent's member the way Plane's editor writes a mention picked from its
// list: a mention-component naming the member's user id, with no "@name"
// text at all.
func (pc planeCtx) mentionsAgentMember(commentHTML string) bool {
	for _, id := range webhook.MentionedUsers(commentHTML) {
		if pc.isAgent(id) {
			return true
		}
	}
	return false
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
