package trigger

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/registry"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// Gitea decides on one Gitea delivery. eventType is X-Gitea-Event-Type,
// delivery is X-Gitea-Delivery. A body that is not valid JSON for its event
// is an error; everything orch does not act on is an Ignore.
func Gitea(reg *registry.Registry, eventType, delivery string, body []byte, now time.Time) (Decision, error) {
	switch eventType {
	case "pull_request":
		var ev webhook.GiteaPullRequestEvent
		if err := json.Unmarshal(body, &ev); err != nil {
			return Decision{}, fmt.Errorf("malformed %s payload: %w", eventType, err)
		}
		if ev.PullRequest == nil {
			return Decision{}, fmt.Errorf("malformed %s payload: no pull_request", eventType)
		}
		p, ok := reg.ByGiteaRepo(ev.Repository.FullName)
		if !ok {
			return Ignore("unknown repository %q", ev.Repository.FullName), nil
		}
		return giteaPullRequest(p, &ev, eventType, delivery, now), nil
	case "":
		return Decision{}, fmt.Errorf("missing %s header", webhook.GiteaEventType)
	}
	return Ignore("event %q is not acted on", eventType), nil
}

func giteaPullRequest(p *registry.Project, ev *webhook.GiteaPullRequestEvent, eventType, delivery string, now time.Time) Decision {
	pr := ev.PullRequest
	switch ev.Action {
	case "opened", "reopened", "synchronized":
	default:
		return Ignore("pull request action %q is not acted on", ev.Action)
	}
	task := prTask(pr)
	key := fmt.Sprintf("gitea|%s|pr|%d|%s|%s", ev.Repository.FullName, pr.Number, ev.Action, pr.Head.SHA)
	src := proto.Source{System: "gitea", Event: eventType + "/" + ev.Action, Delivery: delivery, Actor: ev.Sender.Login}
	return Decision{Jobs: []proto.Job{newJob(p, proto.KindReview, key, task, src, now)}}
}

// prTask is the task a pull request belongs to: the task of its agent
// branch, or pr-<number>.
func prTask(pr *webhook.GiteaPullRequest) proto.Task {
	id, ok := TaskOfBranch(pr.Head.Ref)
	if !ok {
		id = fmt.Sprintf("pr-%d", pr.Number)
	}
	return proto.Task{ID: id, Title: pr.Title, Body: pr.Body, URL: pr.HTMLURL, Branch: pr.Head.Ref, PR: pr.Number}
}
