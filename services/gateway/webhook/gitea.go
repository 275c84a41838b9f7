package webhook

// Gitea headers.
const (
	// GiteaEventType is the fine-grained event name orch routes on, such
	// as pull_request_sync or pull_request_review_rejected.
	GiteaEventType   = "X-Gitea-Event-Type"
	GiteaSignature   = "X-Gitea-Signature"
	GiteaDelivery    = "X-Gitea-Delivery"
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
	ID      int64       `json:"id"`
	Number  int         `json:"number"`
	Title   string      `json:"title"`
	Body    string      `json:"body"`
	HTMLURL string      `json:"html_url"`
	State   string      `json:"state"`
	Merged  bool        `json:"merged"`
	User    GiteaUser   `json:"user"`
	Head    GiteaBranch `json:"head"`
	Base    GiteaBranch `json:"base"`
}

// GiteaPullRequestEvent is the body of pull_request* deliveries.
type GiteaPullRequestEvent struct {
	Action      string            `json:"action"`
	Number      int               `json:"number"`
	PullRequest *GiteaPullRequest `json:"pull_request"`
	Repository  GiteaRepo         `json:"repository"`
	Sender      GiteaUser         `json:"sender"`
}
