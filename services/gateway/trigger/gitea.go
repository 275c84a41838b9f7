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

// source names the event and whose words Job.Trigger holds, and whether
// the project trusts them.
func (g giteaCtx) source(action, actor string) proto.Source {
	return proto.Source{System: "gitea", Event: g.eventType + "/" + action, Delivery: g.delivery, Actor: actor, Trusted: g.p.TrustsGitea(actor)}
}

// isAgent reports whether login is the agent's own Gitea account (Gitea
// logins are case-insensitive).
func (g giteaCtx) isAgent(login string) bool {
	return g.p.AgentUser != "" && strings.EqualFold(login, g.p.AgentUser)
}

// untrusted is the answer to a person whose words would reach the agent
// but who is not among the project's trusted_actors.
func untrusted(actor string) Decision { return Ignore("actor %q is not trusted", actor) }

func (g giteaCtx) pullRequest(ev *webhook.GiteaPullRequestEvent) Decision {
	pr := ev.PullRequest
	repo := ev.Repository.FullName
	task := g.prTask(pr, repo)
	src := g.source(ev.Action, ev.Sender.Login)
	switch g.eventType {
	case "pull_request_review_rejected":
		if ev.Action != "reviewed" {
			return Ignore("review action %q is not acted on", ev.Action)
		}
		if g.isAgent(ev.Sender.Login) {
			return Ignore("review by the agent's own account %q", ev.Sender.Login)
		}
		if _, ok := ownTask(pr, repo); !ok {
			return Ignore("changes requested on %q, not an agent branch", headName(pr, repo))
		}
		// The review's text becomes the fix's instructions: the reviewer
		// (the sender; Gitea's review object names no user) must be
		// trusted.
		if !src.Trusted {
			return untrusted(ev.Sender.Login)
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
	if g.isAgent(actor) || g.isAgent(ev.Sender.Login) {
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
	// Gitea names an account by its login; the e-mail in its payloads
	// is unconfirmed or a placeholder, so it is not asked.
	if !g.p.TrustsGitea(actor) {
		return untrusted(actor)
	}
	var task proto.Task
	switch {
	case ev.PullRequest != nil:
		task = g.prTask(ev.PullRequest, ev.Repository.FullName)
	case ev.IsPull || is.IsPullRequest || g.eventType == "pull_request_comment":
		task = g.withAuthor(proto.Task{ID: fmt.Sprintf("pr-%d", is.Number), Title: is.Title, Body: is.Body, URL: is.HTMLURL, PR: is.Number}, is.User.Login)
	default:
		task = g.withAuthor(proto.Task{ID: fmt.Sprintf("issue-%d", is.Number), Title: is.Title, Body: is.Body, URL: is.HTMLURL}, is.User.Login)
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
	// A run for a pull request event ran on the pull request's ref
	// (refs/pull/<n>/head, or the base branch for pull_request_target),
	// and Gitea's payload does not say whose head that is: it is never
	// taken for a run on orch's own branch. A push to an agent branch of
	// the repository itself runs with event push.
	if strings.HasPrefix(run.Event, "pull_request") {
		return Ignore("workflow run for a %s event, not a push to an agent branch", run.Event)
	}
	if h := run.HeadRepository.FullName; h != "" && !strings.EqualFold(h, ev.Repository.FullName) {
		return Ignore("workflow run failed on %s:%s, a fork, not an agent branch", h, run.HeadBranch)
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
// branch (see ownTask), or pr-<number>. It names the head branch and
// commit, so the runner runs the job at the pull request's head, and the
// author of its title and body.
func (g giteaCtx) prTask(pr *webhook.GiteaPullRequest, repo string) proto.Task {
	id, ok := ownTask(pr, repo)
	if !ok {
		id = fmt.Sprintf("pr-%d", pr.Number)
	}
	return g.withAuthor(proto.Task{ID: id, Title: pr.Title, Body: pr.Body, URL: pr.HTMLURL, Branch: pr.Head.Ref, PR: pr.Number, HeadSHA: pr.Head.SHA,
		FromFork: !headInBase(pr, repo)}, pr.User.Login)
}

// withAuthor records who wrote the task's title and body, and whether
// the project trusts them.
func (g giteaCtx) withAuthor(t proto.Task, login string) proto.Task {
	t.Author, t.AuthorTrusted = login, g.p.TrustsGitea(login)
	return t
}

// ownTask returns the task of a pull request on one of orch's agent
// branches: a head branch agent/<task> in the base repository itself. A
// fork's branch of that name is a person's, whoever named it so.
func ownTask(pr *webhook.GiteaPullRequest, repo string) (string, bool) {
	if !headInBase(pr, repo) {
		return "", false
	}
	return TaskOfBranch(pr.Head.Ref)
}

// headInBase reports whether a pull request's head branch is in its base
// repository (repo, the delivery's repository, when the payload's base
// names none). Every piece of the payload that tells must agree: the
// head's repo_id with the base's, and the head's repository name with
// the base's. A payload that tells nothing (no head repository, as from
// older senders or once a fork is deleted) is taken for a fork.
func headInBase(pr *webhook.GiteaPullRequest, repo string) bool {
	told := false
	if h, b := pr.Head.RepoID, pr.Base.RepoID; h != 0 && b != 0 {
		if h != b {
			return false
		}
		told = true
	}
	if h := pr.Head.Repo.FullName; h != "" {
		// Gitea's owner and repository names are case-insensitive.
		if !strings.EqualFold(h, cmpOr(pr.Base.Repo.FullName, repo)) {
			return false
		}
		told = true
	}
	return told
}

// headName is how a reason names a pull request's head: its branch, and
// the repository when it is another.
func headName(pr *webhook.GiteaPullRequest, repo string) string {
	if headInBase(pr, repo) {
		return pr.Head.Ref
	}
	return cmpOr(pr.Head.Repo.FullName, "an unnamed repository") + ":" + pr.Head.Ref
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
