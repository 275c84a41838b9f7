package trackertest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// GiteaComment is a comment the fake Gitea holds, with every body it had.
type GiteaComment struct {
	ID     int64
	Repo   string
	Index  int
	Author string
	Body   string
	// Bodies lists the body after the create and after each edit that
	// changed it.
	Bodies []string

	created, updated time.Time
}

// GiteaStatus is one commit status the fake Gitea accepted.
type GiteaStatus struct {
	SHA, State, Context, TargetURL, Description string
}

// Gitea is a fake Gitea API under /api/v1: issue comments (list, create,
// edit), issues and pull requests (get) and commit statuses (create), with
// "Authorization: token <Token>". Its answers, errors included, are those
// of Gitea 1.26.0, checked against a real one by
// deployments/local/realgitea.sh (docs/notifier.md): a deleted pull
// request answers 404 to a get but 500 to listing or adding comments, a
// commit status is accepted for any commit of the repository (with any
// state) and answered 500 for an unknown one.
type Gitea struct {
	*httptest.Server
	faults
	// Token is the only accepted API token; User is its account.
	Token, User string

	mu       sync.Mutex
	prs      map[string]string // "owner/repo#index" -> head sha
	commits  map[string]bool   // every head sha ever added: commits outlive their pull request
	comments []*GiteaComment
	statuses []GiteaStatus
	nextID   int64
}

// NewGitea starts a fake Gitea for the test.
func NewGitea(t testing.TB, token, user string) *Gitea {
	g := &Gitea{Token: token, User: user, prs: map[string]string{}, commits: map[string]bool{}, nextID: 100}
	mux := http.NewServeMux()
	route := func(pattern string, h func(http.ResponseWriter, *http.Request)) {
		mux.HandleFunc(pattern, g.wrap(pattern[strings.IndexByte(pattern, ' ')+1:], h))
	}
	route("GET /api/v1/repos/{owner}/{repo}/pulls/{index}", g.getPR(g.pullJSON))
	route("GET /api/v1/repos/{owner}/{repo}/issues/{index}", g.getPR(g.issueJSON))
	route("GET /api/v1/repos/{owner}/{repo}/issues/{index}/comments", g.listComments)
	route("POST /api/v1/repos/{owner}/{repo}/issues/{index}/comments", g.createComment)
	route("PATCH /api/v1/repos/{owner}/{repo}/issues/comments/{id}", g.editComment)
	route("POST /api/v1/repos/{owner}/{repo}/statuses/{sha}", g.createStatus)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusNotFound, giteaNotFound()) })
	g.Server = httptest.NewServer(mux)
	t.Cleanup(g.Close)
	return g
}

func giteaMsg(m string) any { return map[string]string{"message": m, "url": "/api/swagger"} }

// giteaNotFound is Gitea's 404 body; errs, when given, say what was missing.
func giteaNotFound(errs ...string) any {
	return map[string]any{"errors": errs, "message": "not found", "url": "/api/swagger"}
}

// giteaInternal answers as Gitea does to an error it did not expect: 500
// with an empty message (the cause goes only to Gitea's log).
func giteaInternal(w http.ResponseWriter) {
	writeJSON(w, http.StatusInternalServerError, giteaMsg(""))
}

// AddPR makes pull request index of repo exist with head sha (again
// with a new sha: a push to it).
func (g *Gitea) AddPR(repo string, index int, sha string) {
	g.mu.Lock()
	g.prs[prKey(repo, index)] = sha
	g.commits[sha] = true
	g.mu.Unlock()
}

// DeletePR makes pull request index of repo, and its comments, vanish as
// an admin's delete does: a get of it or of a comment answers 404,
// listing or adding comments 500; its commits stay and take statuses.
func (g *Gitea) DeletePR(repo string, index int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.prs, prKey(repo, index))
	kept := g.comments[:0]
	for _, c := range g.comments {
		if c.Repo != repo || c.Index != index {
			kept = append(kept, c)
		}
	}
	g.comments = kept
}

// Comments returns copies of the comments on pull request index of repo.
func (g *Gitea) Comments(repo string, index int) []GiteaComment {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []GiteaComment
	for _, c := range g.comments {
		if c.Repo == repo && c.Index == index {
			cc := *c
			cc.Bodies = append([]string(nil), c.Bodies...)
			out = append(out, cc)
		}
	}
	return out
}

// Statuses returns the commit statuses posted for sha, oldest first.
func (g *Gitea) Statuses(sha string) []GiteaStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []GiteaStatus
	for _, s := range g.statuses {
		if s.SHA == sha {
			out = append(out, s)
		}
	}
	return out
}

func prKey(repo string, index int) string { return repo + "#" + strconv.Itoa(index) }

// wrap checks the token, logs the request and applies a fault. Gitea
// tells a missing token from a wrong one.
func (g *Gitea) wrap(route string, h func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		ft := g.note(r, route, auth)
		switch {
		case auth == "":
			writeJSON(w, http.StatusUnauthorized, giteaMsg("token is required"))
			return
		case auth != "token "+g.Token:
			writeJSON(w, http.StatusUnauthorized, giteaMsg("invalid username, password or token"))
			return
		}
		answer(w, r, ft, h, giteaMsg)
	}
}

func (g *Gitea) pr(r *http.Request) (repo string, index int, sha string, ok bool) {
	repo = r.PathValue("owner") + "/" + r.PathValue("repo")
	index, _ = strconv.Atoi(r.PathValue("index"))
	sha, ok = g.prs[prKey(repo, index)]
	return repo, index, sha, ok
}

// getPR answers a get of a pull request, or of its issue (Gitea has an
// issue of the same number behind every pull request): 404 for one it
// does not have, else its number and state with the fields more adds.
func (g *Gitea) getPR(more func(repo string, index int, sha string) map[string]any) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		repo, index, sha, ok := g.pr(r)
		g.mu.Unlock()
		if !ok {
			writeJSON(w, http.StatusNotFound, giteaNotFound())
			return
		}
		out := more(repo, index, sha)
		out["number"], out["state"] = index, "open"
		writeJSON(w, http.StatusOK, out)
	}
}

func (g *Gitea) pullJSON(_ string, _ int, sha string) map[string]any {
	return map[string]any{"head": map[string]any{"sha": sha, "ref": "agent/task", "label": "agent/task"}}
}

func (g *Gitea) issueJSON(repo string, index int, _ string) map[string]any {
	return map[string]any{"pull_request": map[string]any{"merged": false, "html_url": fmt.Sprintf("%s/%s/pulls/%d", g.URL, repo, index)}}
}

func (g *Gitea) commentJSON(c *GiteaComment) any {
	pull := fmt.Sprintf("%s/%s/pulls/%d", g.URL, c.Repo, c.Index)
	return map[string]any{
		"id": c.ID, "body": c.Body, "user": map[string]any{"login": c.Author},
		"html_url": fmt.Sprintf("%s#issuecomment-%d", pull, c.ID), "pull_request_url": pull, "issue_url": "",
		"created_at": c.created.Format(time.RFC3339), "updated_at": c.updated.Format(time.RFC3339),
	}
}

// onComments calls f, with the fake locked, for the pull request whose
// comments r lists or adds to. For one the fake does not have it answers
// 500, as Gitea 1.26 does: it does not tell a missing issue there.
func (g *Gitea) onComments(w http.ResponseWriter, r *http.Request, f func(repo string, index int)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	repo, index, _, ok := g.pr(r)
	if !ok {
		giteaInternal(w)
		return
	}
	f(repo, index)
}

func (g *Gitea) listComments(w http.ResponseWriter, r *http.Request) {
	g.onComments(w, r, func(repo string, index int) {
		out := []any{}
		for _, c := range g.comments {
			if c.Repo == repo && c.Index == index {
				out = append(out, g.commentJSON(c))
			}
		}
		writeJSON(w, http.StatusOK, out)
	})
}

// commentBody reads the body of a comment create or edit; where it has
// none it answers 422, as Gitea does.
func commentBody(w http.ResponseWriter, r *http.Request) (string, bool) {
	var in struct {
		Body string `json:"body"`
	}
	if err := decode(r, &in); err != nil || in.Body == "" {
		writeJSON(w, http.StatusUnprocessableEntity, giteaMsg("[Body]: Required"))
		return "", false
	}
	return in.Body, true
}

func (g *Gitea) createComment(w http.ResponseWriter, r *http.Request) {
	body, ok := commentBody(w, r)
	if !ok {
		return
	}
	g.onComments(w, r, func(repo string, index int) {
		g.nextID++
		now := time.Now().UTC()
		c := &GiteaComment{ID: g.nextID, Repo: repo, Index: index, Author: g.User, Body: body, Bodies: []string{body}, created: now, updated: now}
		g.comments = append(g.comments, c)
		writeJSON(w, http.StatusCreated, g.commentJSON(c))
	})
}

func (g *Gitea) editComment(w http.ResponseWriter, r *http.Request) {
	body, ok := commentBody(w, r)
	if !ok {
		return
	}
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	repo := r.PathValue("owner") + "/" + r.PathValue("repo")
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.comments {
		if c.ID == id && c.Repo == repo {
			if body != c.Body { // Gitea leaves an unchanged comment as it is
				c.Body, c.updated = body, time.Now().UTC()
				c.Bodies = append(c.Bodies, body)
			}
			writeJSON(w, http.StatusOK, g.commentJSON(c))
			return
		}
	}
	writeJSON(w, http.StatusNotFound, giteaNotFound(fmt.Sprintf("comment does not exist [id: %d, issue_id: 0]", id)))
}

// createStatus takes a status for any commit the repository has, as
// Gitea 1.26 does, whatever its state (Gitea does not check it).
func (g *Gitea) createStatus(w http.ResponseWriter, r *http.Request) {
	var body struct {
		State       string `json:"state"`
		TargetURL   string `json:"target_url"`
		Description string `json:"description"`
		Context     string `json:"context"`
	}
	if err := decode(r, &body); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, giteaMsg(err.Error()))
		return
	}
	s := GiteaStatus{SHA: r.PathValue("sha"), State: body.State, Context: body.Context, TargetURL: body.TargetURL, Description: body.Description}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.commits[s.SHA] {
		giteaInternal(w)
		return
	}
	g.statuses = append(g.statuses, s)
	now := time.Now().UTC().Format(time.RFC3339)
	writeJSON(w, http.StatusCreated, map[string]any{
		"id": len(g.statuses), "status": s.State, "context": s.Context, "target_url": s.TargetURL, "description": s.Description,
		"url":     g.URL + "/api/v1/repos/" + r.PathValue("owner") + "/" + r.PathValue("repo") + "/statuses/" + s.SHA,
		"creator": map[string]any{"login": g.User}, "created_at": now, "updated_at": now,
	})
}
