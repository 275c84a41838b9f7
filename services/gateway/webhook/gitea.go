package webhook

import (
	"fmt"

	"github.com/valyala/fastjson"
)

// Gitea headers.
const (
	// GiteaEventType is the fine-grained event name orch routes on, such
	// as pull_request_sync or pull_request_review_rejected.
	GiteaEventType = "X-Gitea-Event-Type"
	// GiteaSignature is the lowercase hex HMAC-SHA256 of the raw body.
	GiteaSignature = "X-Gitea-Signature"
	// GiteaDelivery is the delivery id; it changes on a manual redeliver,
	// so it is never a dedupe key.
	GiteaDelivery = "X-Gitea-Delivery"
	// GiteaEventCoarse is the coarse event name (pull_request for every
	// pull request event); orch does not route on it.
	GiteaEventCoarse = "X-Gitea-Event"
)

// The payload types hold only what the trigger reads; every other member
// of a delivery is checked to be JSON and otherwise skipped, whatever its
// type. The field comments name the JSON members.

// GiteaUser is an account in a Gitea payload.
type GiteaUser struct {
	Login string // login
	Email string // email
}

// GiteaRepo is the repository a delivery is about.
type GiteaRepo struct {
	FullName string // full_name
}

// GiteaBranch is one side of a pull request.
type GiteaBranch struct {
	Ref string // ref
	SHA string // sha
	// RepoID and Repo name the repository the branch is in: for the head
	// of a fork's pull request, the fork. Gitea sends repo null once that
	// repository is deleted; older payloads may lack both.
	RepoID int64     // repo_id
	Repo   GiteaRepo // repo
}

// GiteaPullRequest is the pull_request object.
type GiteaPullRequest struct {
	Number   int         // number
	Title    string      // title
	Body     string      // body
	HTMLURL  string      // html_url
	Head     GiteaBranch // head
	Base     GiteaBranch // base
	ClosedAt string      // closed_at
	// User is the pull request's author, who wrote Title and Body.
	User GiteaUser // user
}

// GiteaReview is the review of a pull_request_review_* delivery.
type GiteaReview struct {
	Content string // content
}

// GiteaPullRequestEvent is the body of pull_request* deliveries, the
// review ones included (they carry Review).
type GiteaPullRequestEvent struct {
	Action      string            // action
	PullRequest *GiteaPullRequest // pull_request
	Review      *GiteaReview      // review
	Repository  GiteaRepo         // repository
	Sender      GiteaUser         // sender
}

// GiteaIssue is the issue object; a pull request's conversation is one.
type GiteaIssue struct {
	Number  int    // number
	Title   string // title
	Body    string // body
	HTMLURL string // html_url
	// User is the issue's author, who wrote Title and Body.
	User GiteaUser // user
	// IsPullRequest says the issue is a pull request: Gitea then sets its
	// pull_request member (an object without branches).
	IsPullRequest bool
}

// GiteaComment is one comment.
type GiteaComment struct {
	ID        int64     // id
	Body      string    // body
	User      GiteaUser // user
	CreatedAt string    // created_at
}

// GiteaCommentEvent is the body of issue_comment and pull_request_comment
// deliveries.
type GiteaCommentEvent struct {
	Action  string        // action
	Issue   *GiteaIssue   // issue
	Comment *GiteaComment // comment
	// PullRequest is sent by some Gitea versions with pull request
	// comments; it names the head branch.
	PullRequest *GiteaPullRequest // pull_request
	IsPull      bool              // is_pull
	Repository  GiteaRepo         // repository
	Sender      GiteaUser         // sender
}

// GiteaWorkflow is the workflow of a workflow_run delivery.
type GiteaWorkflow struct {
	Name string // name
}

// GiteaWorkflowRun is the workflow_run object.
type GiteaWorkflowRun struct {
	ID           int64  // id
	HTMLURL      string // html_url
	DisplayTitle string // display_title
	RunAttempt   int64  // run_attempt
	HeadSHA      string // head_sha
	HeadBranch   string // head_branch
	Conclusion   string // conclusion
	// Event is what started the run: push, pull_request,
	// pull_request_target, ...
	Event string // event
	// HeadRepository is GitHub's member naming the repository of the
	// head; Gitea (1.25, 1.26) does not send it, but a sender that does
	// is believed.
	HeadRepository GiteaRepo // head_repository
}

// GiteaWorkflowRunEvent is the body of workflow_run deliveries.
type GiteaWorkflowRunEvent struct {
	Action      string            // action
	Workflow    *GiteaWorkflow    // workflow
	WorkflowRun *GiteaWorkflowRun // workflow_run
	Repository  GiteaRepo         // repository
	Sender      GiteaUser         // sender
}

// GiteaEvent is one parsed Gitea delivery: exactly one of the pointers is
// set, or none for an event type orch does not read.
type GiteaEvent struct {
	Type        string
	PullRequest *GiteaPullRequestEvent
	Comment     *GiteaCommentEvent
	WorkflowRun *GiteaWorkflowRunEvent
}

// Repo is the repository full name of the delivery, empty if unknown.
func (e *GiteaEvent) Repo() string {
	switch {
	case e.PullRequest != nil:
		return e.PullRequest.Repository.FullName
	case e.Comment != nil:
		return e.Comment.Repository.FullName
	case e.WorkflowRun != nil:
		return e.WorkflowRun.Repository.FullName
	}
	return ""
}

// ParseGitea parses the body of a Gitea delivery of the given
// X-Gitea-Event-Type. Event types orch does not act on are returned with
// no payload and no error; a body that is not the JSON its type promises
// is an error wrapping ErrMalformed.
func ParseGitea(eventType string, body []byte) (*GiteaEvent, error) {
	if eventType == "" {
		return nil, fmt.Errorf("%w: missing %s header", ErrMalformed, GiteaEventType)
	}
	p := parsers.Get()
	defer parsers.Put(p)
	// Even an event orch does not read must be JSON: a form-encoded or
	// garbled body is a misconfigured webhook, and the sender should
	// hear it.
	v, err := parseJSON(p, body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s payload is not JSON: %v", ErrMalformed, eventType, err)
	}
	ev := &GiteaEvent{Type: eventType}
	r := reader{path: make([][]byte, 0, 4)}
	switch eventType {
	case "pull_request", "pull_request_sync", "pull_request_review_rejected",
		"pull_request_review_approved", "pull_request_review_comment":
		ev.PullRequest = &GiteaPullRequestEvent{}
		r.pullRequestEvent(v, ev.PullRequest)
		if r.err == nil && ev.PullRequest.PullRequest == nil {
			r.err = fmt.Errorf("no pull_request")
		}
	case "issue_comment", "pull_request_comment":
		ev.Comment = &GiteaCommentEvent{}
		r.commentEvent(v, ev.Comment)
		if r.err == nil && (ev.Comment.Issue == nil || ev.Comment.Comment == nil) {
			r.err = fmt.Errorf("no issue or comment")
		}
	case "workflow_run":
		ev.WorkflowRun = &GiteaWorkflowRunEvent{}
		r.workflowRunEvent(v, ev.WorkflowRun)
		if r.err == nil && ev.WorkflowRun.WorkflowRun == nil {
			r.err = fmt.Errorf("no workflow_run")
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %s payload: %v", ErrMalformed, eventType, r.err)
	}
	return ev, nil
}

func (r *reader) pullRequestEvent(v *fastjson.Value, ev *GiteaPullRequestEvent) {
	r.object(nil, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "action":
			r.str(k, v, &ev.Action)
		case "pull_request":
			ptr(r, k, v, &ev.PullRequest, (*reader).pullRequest)
		case "review":
			ptr(r, k, v, &ev.Review, (*reader).review)
		case "repository":
			r.repo(k, v, &ev.Repository)
		case "sender":
			r.user(k, v, &ev.Sender)
		}
	})
}

func (r *reader) commentEvent(v *fastjson.Value, ev *GiteaCommentEvent) {
	r.object(nil, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "action":
			r.str(k, v, &ev.Action)
		case "issue":
			ptr(r, k, v, &ev.Issue, (*reader).issue)
		case "comment":
			ptr(r, k, v, &ev.Comment, (*reader).comment)
		case "pull_request":
			ptr(r, k, v, &ev.PullRequest, (*reader).pullRequest)
		case "is_pull":
			r.bool(k, v, &ev.IsPull)
		case "repository":
			r.repo(k, v, &ev.Repository)
		case "sender":
			r.user(k, v, &ev.Sender)
		}
	})
}

func (r *reader) workflowRunEvent(v *fastjson.Value, ev *GiteaWorkflowRunEvent) {
	r.object(nil, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "action":
			r.str(k, v, &ev.Action)
		case "workflow":
			ptr(r, k, v, &ev.Workflow, func(r *reader, k []byte, v *fastjson.Value, w *GiteaWorkflow) {
				r.object(k, v, func(k []byte, v *fastjson.Value) {
					if string(k) == "name" {
						r.str(k, v, &w.Name)
					}
				})
			})
		case "workflow_run":
			ptr(r, k, v, &ev.WorkflowRun, (*reader).workflowRun)
		case "repository":
			r.repo(k, v, &ev.Repository)
		case "sender":
			r.user(k, v, &ev.Sender)
		}
	})
}

func (r *reader) user(key []byte, v *fastjson.Value, u *GiteaUser) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "login":
			r.str(k, v, &u.Login)
		case "email":
			r.str(k, v, &u.Email)
		}
	})
}

func (r *reader) repo(key []byte, v *fastjson.Value, repo *GiteaRepo) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		if string(k) == "full_name" {
			r.str(k, v, &repo.FullName)
		}
	})
}

func (r *reader) pullRequest(key []byte, v *fastjson.Value, pr *GiteaPullRequest) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "number":
			r.int(k, v, &pr.Number)
		case "title":
			r.str(k, v, &pr.Title)
		case "body":
			r.str(k, v, &pr.Body)
		case "html_url":
			r.str(k, v, &pr.HTMLURL)
		case "closed_at":
			r.str(k, v, &pr.ClosedAt)
		case "head":
			r.branch(k, v, &pr.Head)
		case "base":
			r.branch(k, v, &pr.Base)
		case "user":
			r.user(k, v, &pr.User)
		}
	})
}

func (r *reader) branch(key []byte, v *fastjson.Value, b *GiteaBranch) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "ref":
			r.str(k, v, &b.Ref)
		case "sha":
			r.str(k, v, &b.SHA)
		case "repo_id":
			r.int64(k, v, &b.RepoID)
		case "repo":
			r.repo(k, v, &b.Repo)
		}
	})
}

func (r *reader) review(key []byte, v *fastjson.Value, rv *GiteaReview) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		if string(k) == "content" {
			r.str(k, v, &rv.Content)
		}
	})
}

func (r *reader) issue(key []byte, v *fastjson.Value, is *GiteaIssue) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "number":
			r.int(k, v, &is.Number)
		case "title":
			r.str(k, v, &is.Title)
		case "body":
			r.str(k, v, &is.Body)
		case "html_url":
			r.str(k, v, &is.HTMLURL)
		case "user":
			r.user(k, v, &is.User)
		case "pull_request":
			switch v.Type() {
			case fastjson.TypeNull:
				is.IsPullRequest = false
			default:
				is.IsPullRequest = true
				r.object(k, v, func(k []byte, v *fastjson.Value) {
					if string(k) == "html_url" {
						var url string
						r.str(k, v, &url)
					}
				})
			}
		}
	})
}

func (r *reader) comment(key []byte, v *fastjson.Value, c *GiteaComment) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "id":
			r.int64(k, v, &c.ID)
		case "body":
			r.str(k, v, &c.Body)
		case "user":
			r.user(k, v, &c.User)
		case "created_at":
			r.str(k, v, &c.CreatedAt)
		}
	})
}

func (r *reader) workflowRun(key []byte, v *fastjson.Value, run *GiteaWorkflowRun) {
	r.object(key, v, func(k []byte, v *fastjson.Value) {
		switch string(k) {
		case "id":
			r.int64(k, v, &run.ID)
		case "html_url":
			r.str(k, v, &run.HTMLURL)
		case "display_title":
			r.str(k, v, &run.DisplayTitle)
		case "run_attempt":
			r.int64(k, v, &run.RunAttempt)
		case "head_sha":
			r.str(k, v, &run.HeadSHA)
		case "head_branch":
			r.str(k, v, &run.HeadBranch)
		case "conclusion":
			r.str(k, v, &run.Conclusion)
		case "event":
			r.str(k, v, &run.Event)
		case "head_repository":
			r.repo(k, v, &run.HeadRepository)
		}
	})
}
