package writeback

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/orch-dev/orch/proto"
)

// Gitea is a client of the parts of Gitea's API the write-back uses: a
// pull request's head, its comments and commit statuses. The token needs
// the scopes write:issue (comments) and write:repository (statuses); its
// account should be the projects' agent_user.
type Gitea struct{ api }

// NewGitea returns a client of the Gitea at base (as a person types it,
// e.g. https://git.example.com) with token.
func NewGitea(base, token string, hc *http.Client) *Gitea {
	return &Gitea{api{name: "gitea", base: base, authHeader: "Authorization", authValue: "token " + token, http: hc}}
}

// repoPath is /repos/{owner}/{repo} with both parts escaped.
func repoPath(repo string) (string, error) {
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || owner == "" || name == "" {
		return "", fmt.Errorf("gitea repository %q is not owner/name", repo)
	}
	return "/repos/" + url.PathEscape(owner) + "/" + url.PathEscape(name), nil
}

// PullHead returns the head commit of pull request index.
func (g *Gitea) PullHead(ctx context.Context, repo string, index int) (string, error) {
	rp, err := repoPath(repo)
	if err != nil {
		return "", err
	}
	var pr struct {
		Head struct {
			SHA string `json:"sha"`
		} `json:"head"`
	}
	if err := g.do(ctx, "reading pull request", http.MethodGet, fmt.Sprintf("%s/pulls/%d", rp, index), nil, &pr); err != nil {
		return "", err
	}
	if pr.Head.SHA == "" {
		return "", fmt.Errorf("gitea: pull request %s#%d has no head sha", repo, index)
	}
	return pr.Head.SHA, nil
}

// FindComment returns the id of the comment on issue or pull request
// index whose body carries job's marker, or 0. Gitea lists an issue's
// comments in one answer.
func (g *Gitea) FindComment(ctx context.Context, repo string, index int, job string) (int64, error) {
	rp, err := repoPath(repo)
	if err != nil {
		return 0, err
	}
	var list []struct {
		ID   int64  `json:"id"`
		Body string `json:"body"`
	}
	if err := g.do(ctx, "listing comments", http.MethodGet, fmt.Sprintf("%s/issues/%d/comments", rp, index), nil, &list); err != nil {
		return 0, g.goneOr(ctx, rp, index, err)
	}
	marker := proto.CommentMarker(job)
	for _, c := range list {
		if strings.Contains(c.Body, marker) {
			return c.ID, nil
		}
	}
	return 0, nil
}

// CreateComment posts body on issue or pull request index and returns the
// comment's id.
func (g *Gitea) CreateComment(ctx context.Context, repo string, index int, body string) (int64, error) {
	rp, err := repoPath(repo)
	if err != nil {
		return 0, err
	}
	var c struct {
		ID int64 `json:"id"`
	}
	if err := g.do(ctx, "creating comment", http.MethodPost, fmt.Sprintf("%s/issues/%d/comments", rp, index), map[string]string{"body": body}, &c); err != nil {
		return 0, g.goneOr(ctx, rp, index, err)
	}
	return c.ID, nil
}

// goneOr turns err, Gitea's answer to a request about the comments of
// issue or pull request index, into the 404 when the issue no
// longer exists. Gitea (1.26) answers 500, not 404, to listing or adding
// comments of an issue it does not have (one deleted by an admin), so a
// 5xx there is checked by reading the issue, which does answer 404. Any
// other error, or an issue that exists, leaves err as it is (retried).
func (g *Gitea) goneOr(ctx context.Context, rp string, index int, err error) error {
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Code < 500 {
		return err
	}
	if ierr := g.do(ctx, "reading the issue after "+apiErr.Op, http.MethodGet, fmt.Sprintf("%s/issues/%d", rp, index), nil, nil); errors.Is(ierr, ErrGone) {
		return ierr
	}
	return err
}

// EditComment replaces the body of comment id.
func (g *Gitea) EditComment(ctx context.Context, repo string, id int64, body string) error {
	rp, err := repoPath(repo)
	if err != nil {
		return err
	}
	return g.do(ctx, "editing comment", http.MethodPatch, fmt.Sprintf("%s/issues/comments/%d", rp, id), map[string]string{"body": body}, nil)
}

// CommitStatus is one status on a commit, shown next to a pull request's
// checks.
type CommitStatus struct {
	// State is pending, success, failure or error.
	State       string `json:"state"`
	TargetURL   string `json:"target_url,omitempty"`
	Description string `json:"description"`
	// Context names the check: proto.StatusContextPrefix + kind.
	Context string `json:"context"`
}

// SetStatus posts a commit status on sha.
func (g *Gitea) SetStatus(ctx context.Context, repo, sha string, s CommitStatus) error {
	rp, err := repoPath(repo)
	if err != nil {
		return err
	}
	return g.do(ctx, "setting commit status", http.MethodPost, rp+"/statuses/"+url.PathEscape(sha), s, nil)
}
