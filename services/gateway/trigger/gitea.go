package trigger

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// Gitea decides on one Gitea delivery. eventType is X-Gitea-Event-Type,
// delivery is X-Gitea-Delivery. A body that is not valid JSON for its event
// is an error; everything orch does not act on is an Ignore.
func Gitea(reg *registry.Registry, eventType, delivery string, body []byte, now time.Time) (Decision, error) {
	ev, err := webhook.ParseGitea(eventType, body)
	if err != nil {
		return Decision{}, err
	}
	repo := ev.Repo()
	if ev.PullRequest == nil && ev.Comment == nil && ev.WorkflowRun == nil {
		return Ignore("gitea event %q is not acted on", eventType), nil
	}
	p, ok := reg.ByGiteaRepo(repo)
	if !ok {
		return Ignore("unknown repository %q", repo), nil
	}
	g := giteaCtx{p: p, eventType: eventType, delivery: delivery, now: now}
	switch {
	case ev.PullRequest != nil:
		return g.pullRequest(ev.PullRequest), nil
	case ev.Comment != nil:
		return g.comment(ev.Comment), nil
	default:
		return g.workflowRun(ev.WorkflowRun), nil
	}
}

type giteaCtx struct {
	p         *registry.Project
	eventType string
	delivery  string
	now       time.Time
}

func (g giteaCtx) source(action, actor string) proto.Source {
	return proto.Source{System: "gitea", Event: g.eventType + "/" + action, Delivery: g.delivery, Actor: actor}
}

func (g giteaCtx) pullRequest(ev *webhook.GiteaPullRequestEvent) Decision {
	pr := ev.PullRequest
	repo := ev.Repository.FullName
	task := prTask(pr)
	src := g.source(ev.Action, ev.Sender.Login)
	switch g.eventType {
	case "pull_request_review_rejected":
		if ev.Action != "reviewed" {
			return Ignore("review action %q is not acted on", ev.Action)
		}
		if g.p.AgentUser != "" && ev.Sender.Login == g.p.AgentUser {
			return Ignore("review by the agent's own account %q", ev.Sender.Login)
		}
		if _, ok := TaskOfBranch(pr.Head.Ref); !ok {
			return Ignore("changes requested on %q, not an agent branch", pr.Head.Ref)
		}
		content := ""
		if ev.Review != nil {
			content = ev.Review.Content
		}
		key := fmt.Sprintf("gitea|%s|pr|%d|review_rejected|%s|%s|%s", repo, pr.Number, pr.Head.SHA, ev.Sender.Login, digest(content))
		job := newJob(g.p, proto.KindFix, key, task, src, g.now)
		job.Trigger = truncate(content, MaxTriggerText)
		return Decision{Jobs: []proto.Job{job}}
	case "pull_request_review_approved", "pull_request_review_comment":
		return Ignore("gitea event %q is not acted on", g.eventType)
	}
	switch ev.Action {
	case "opened", "reopened", "synchronized":
		key := fmt.Sprintf("gitea|%s|pr|%d|%s|%s", repo, pr.Number, ev.Action, pr.Head.SHA)
		return Decision{Jobs: []proto.Job{newJob(g.p, proto.KindReview, key, task, src, g.now)}}
	case "closed", "deleted":
		// A deleted pull request is gone for good: like a closed one, its
		// jobs are cancelled and its worktree removed.
		key := fmt.Sprintf("gitea|%s|pr|%d|%s|%s|%s", repo, pr.Number, ev.Action, pr.Head.SHA, pr.ClosedAt)
		return Decision{
			Cancel: &Cancel{Project: g.p.Key, Task: TaskID(task.ID), Reason: fmt.Sprintf("pull request #%d %s", pr.Number, ev.Action)},
			Jobs:   []proto.Job{newJob(g.p, proto.KindCleanup, key, task, src, g.now)},
		}
	}
	return Ignore("pull request action %q is not acted on", ev.Action)
}

func (g giteaCtx) comment(ev *webhook.GiteaCommentEvent) Decision {
	if ev.Action != "created" {
		return Ignore("comment action %q is not acted on", ev.Action)
	}
	c, is := ev.Comment, ev.Issue
	actor := cmpOr(c.User.Login, ev.Sender.Login)
	if g.p.AgentUser != "" && (actor == g.p.AgentUser || ev.Sender.Login == g.p.AgentUser) {
		return Ignore("comment by the agent's own account %q", actor)
	}
	if proto.HasCommentMarker(c.Body) {
		// orch's own tracking comment, even when posted with a token of
		// another account than agent_user: it may quote the mention.
		return Ignore("comment is orch's own tracking comment")
	}
	if !Mentions(c.Body, g.p.Mention) {
		return Ignore("comment does not mention %s", g.p.Mention)
	}
	if !g.p.Trusts(actor, c.User.Email) {
		return Ignore("actor %q is not trusted", actor)
	}
	var task proto.Task
	switch {
	case ev.PullRequest != nil:
		task = prTask(ev.PullRequest)
	case ev.IsPull || is.IsPullRequest || g.eventType == "pull_request_comment":
		task = proto.Task{ID: fmt.Sprintf("pr-%d", is.Number), Title: is.Title, Body: is.Body, URL: is.HTMLURL, PR: is.Number}
	default:
		task = proto.Task{ID: fmt.Sprintf("issue-%d", is.Number), Title: is.Title, Body: is.Body, URL: is.HTMLURL}
	}
	key := fmt.Sprintf("gitea|%s|comment|%d", ev.Repository.FullName, c.ID)
	if c.ID == 0 { // not sent by Gitea; never let two comments share a job
		key += "|" + digest(c.Body) + "|" + c.CreatedAt
	}
	job := newJob(g.p, proto.KindRespond, key, task, g.source(ev.Action, actor), g.now)
	job.Trigger = truncate(c.Body, MaxTriggerText)
	return Decision{Jobs: []proto.Job{job}}
}

func (g giteaCtx) workflowRun(ev *webhook.GiteaWorkflowRunEvent) Decision {
	run := ev.WorkflowRun
	if ev.Action != "completed" {
		return Ignore("workflow run action %q is not acted on", ev.Action)
	}
	if run.Conclusion != "failure" {
		return Ignore("workflow run concluded %q, not failure", run.Conclusion)
	}
	taskID, ok := TaskOfBranch(run.HeadBranch)
	if !ok {
		return Ignore("workflow run failed on %q, not an agent branch", run.HeadBranch)
	}
	name := run.DisplayTitle
	if ev.Workflow != nil && ev.Workflow.Name != "" {
		name = ev.Workflow.Name
	}
	task := proto.Task{ID: taskID, Title: "CI failed: " + name, URL: run.HTMLURL, Branch: run.HeadBranch, HeadSHA: run.HeadSHA}
	key := fmt.Sprintf("gitea|%s|workflow_run|%d|%d|%s", ev.Repository.FullName, run.ID, run.RunAttempt, run.HeadSHA)
	job := newJob(g.p, proto.KindFix, key, task, g.source(ev.Action, ev.Sender.Login), g.now)
	job.Trigger = truncate(name, MaxTriggerText)
	return Decision{Jobs: []proto.Job{job}}
}

// prTask is the task a pull request belongs to: the task of its agent
// branch, or pr-<number>. It names the head branch and commit, so the
// runner runs the job at the pull request's head.
func prTask(pr *webhook.GiteaPullRequest) proto.Task {
	id, ok := TaskOfBranch(pr.Head.Ref)
	if !ok {
		id = fmt.Sprintf("pr-%d", pr.Number)
	}
	return proto.Task{ID: id, Title: pr.Title, Body: pr.Body, URL: pr.HTMLURL, Branch: pr.Head.Ref, PR: pr.Number, HeadSHA: pr.Head.SHA}
}

// digest shortens free text for a dedupe key.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

func cmpOr(a, b string) string {
	if strings.TrimSpace(a) != "" {
		return a
	}
	return b
}
