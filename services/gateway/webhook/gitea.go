package webhook

import (
	"encoding/json"
	"fmt"
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

// GiteaUser is an account in a Gitea payload.
type GiteaUser struct {
	ID       int64  `json:"id"`
	Login    string `json:"login"`
	Email    string `json:"email"`
	FullName string `json:"full_name"`
}

// GiteaRepo is the repository a delivery is about.
type GiteaRepo struct {
	ID       int64  `json:"id"`
	FullName string `json:"full_name"`
	HTMLURL  string `json:"html_url"`
	CloneURL string `json:"clone_url"`
}

// GiteaBranch is one side of a pull request.
type GiteaBranch struct {
	Ref string `json:"ref"`
	SHA string `json:"sha"`
}

// GiteaPullRequest is the pull_request object.
type GiteaPullRequest struct {
	ID       int64       `json:"id"`
	Number   int         `json:"number"`
	Title    string      `json:"title"`
	Body     string      `json:"body"`
	HTMLURL  string      `json:"html_url"`
	State    string      `json:"state"`
	Merged   bool        `json:"merged"`
	User     GiteaUser   `json:"user"`
	Head     GiteaBranch `json:"head"`
	Base     GiteaBranch `json:"base"`
	ClosedAt string      `json:"closed_at"`
}

// GiteaReview is the review of a pull_request_review_* delivery.
type GiteaReview struct {
	Type    string `json:"type"`
	Content string `json:"content"`
}

// GiteaPullRequestEvent is the body of pull_request* deliveries, the
// review ones included (they carry Review).
type GiteaPullRequestEvent struct {
	Action      string            `json:"action"`
	Number      int               `json:"number"`
	PullRequest *GiteaPullRequest `json:"pull_request"`
	Review      *GiteaReview      `json:"review"`
	Repository  GiteaRepo         `json:"repository"`
	Sender      GiteaUser         `json:"sender"`
}

// GiteaIssue is the issue object; a pull request's conversation is one.
type GiteaIssue struct {
	ID      int64     `json:"id"`
	Number  int       `json:"number"`
	Title   string    `json:"title"`
	Body    string    `json:"body"`
	HTMLURL string    `json:"html_url"`
	State   string    `json:"state"`
	User    GiteaUser `json:"user"`
	// PullRequest is set (without branches) when the issue is a pull
	// request.
	PullRequest *struct {
		HTMLURL string `json:"html_url"`
	} `json:"pull_request"`
}

// GiteaComment is one comment.
type GiteaComment struct {
	ID        int64     `json:"id"`
	HTMLURL   string    `json:"html_url"`
	Body      string    `json:"body"`
	User      GiteaUser `json:"user"`
	CreatedAt string    `json:"created_at"`
}

// GiteaCommentEvent is the body of issue_comment and pull_request_comment
// deliveries.
type GiteaCommentEvent struct {
	Action  string        `json:"action"`
	Issue   *GiteaIssue   `json:"issue"`
	Comment *GiteaComment `json:"comment"`
	// PullRequest is sent by some Gitea versions with pull request
	// comments; it names the head branch.
	PullRequest *GiteaPullRequest `json:"pull_request"`
	IsPull      bool              `json:"is_pull"`
	Repository  GiteaRepo         `json:"repository"`
	Sender      GiteaUser         `json:"sender"`
}

// GiteaWorkflowRun is the workflow_run object.
type GiteaWorkflowRun struct {
	ID           int64  `json:"id"`
	HTMLURL      string `json:"html_url"`
	DisplayTitle string `json:"display_title"`
	RunAttempt   int64  `json:"run_attempt"`
	HeadSHA      string `json:"head_sha"`
	HeadBranch   string `json:"head_branch"`
	Status       string `json:"status"`
	Conclusion   string `json:"conclusion"`
}

// GiteaWorkflowRunEvent is the body of workflow_run deliveries.
type GiteaWorkflowRunEvent struct {
	Action   string `json:"action"`
	Workflow *struct {
		Name string `json:"name"`
		Path string `json:"path"`
	} `json:"workflow"`
	WorkflowRun *GiteaWorkflowRun `json:"workflow_run"`
	Repository  GiteaRepo         `json:"repository"`
	Sender      GiteaUser         `json:"sender"`
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
	ev := &GiteaEvent{Type: eventType}
	var (
		target any
		check  func() error
	)
	switch eventType {
	case "":
		return nil, fmt.Errorf("%w: missing %s header", ErrMalformed, GiteaEventType)
	case "pull_request", "pull_request_sync", "pull_request_review_rejected",
		"pull_request_review_approved", "pull_request_review_comment":
		ev.PullRequest = &GiteaPullRequestEvent{}
		target = ev.PullRequest
		check = func() error {
			if ev.PullRequest.PullRequest == nil {
				return fmt.Errorf("no pull_request")
			}
			return nil
		}
	case "issue_comment", "pull_request_comment":
		ev.Comment = &GiteaCommentEvent{}
		target = ev.Comment
		check = func() error {
			if ev.Comment.Issue == nil || ev.Comment.Comment == nil {
				return fmt.Errorf("no issue or comment")
			}
			return nil
		}
	case "workflow_run":
		ev.WorkflowRun = &GiteaWorkflowRunEvent{}
		target = ev.WorkflowRun
		check = func() error {
			if ev.WorkflowRun.WorkflowRun == nil {
				return fmt.Errorf("no workflow_run")
			}
			return nil
		}
	default:
		// Still insist on JSON: a form-encoded or garbled body is a
		// misconfigured webhook, and the sender should hear it.
		if !json.Valid(body) {
			return nil, fmt.Errorf("%w: %s payload is not JSON", ErrMalformed, eventType)
		}
		return ev, nil
	}
	if err := json.Unmarshal(body, target); err != nil {
		return nil, fmt.Errorf("%w: %s payload: %v", ErrMalformed, eventType, err)
	}
	if err := check(); err != nil {
		return nil, fmt.Errorf("%w: %s payload: %v", ErrMalformed, eventType, err)
	}
	return ev, nil
}
