package trackertest

import (
	"encoding/json"
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
	// Bodies lists the body after the create and after each edit.
	Bodies []string
}

// GiteaStatus is one commit status the fake Gitea accepted.
type GiteaStatus struct {
	SHA, State, Context, TargetURL, Description string
}

// Gitea is a fake Gitea 1.25 API under /api/v1: issue comments (list,
// create, edit), pull requests (get) and commit statuses (create), with
// "Authorization: token <Token>".
type Gitea struct {
	*httptest.Server
	faults
	// Token is the only accepted API token; User is its account.
	Token, User string

	mu       sync.Mutex
	prs      map[string]string // "owner/repo#index" -> head sha
	comments []*GiteaComment
	statuses []GiteaStatus
	nextID   int64
}

// NewGitea starts a fake Gitea for the test.
func NewGitea(t testing.TB, token, user string) *Gitea {
	g := &Gitea{Token: token, User: user, prs: map[string]string{}, nextID: 100}
	mux := http.NewServeMux()
	route := func(pattern string, h func(http.ResponseWriter, *http.Request)) {
		mux.HandleFunc(pattern, g.wrap(pattern[strings.IndexByte(pattern, ' ')+1:], h))
	}
	route("GET /api/v1/repos/{owner}/{repo}/pulls/{index}", g.getPull)
	route("GET /api/v1/repos/{owner}/{repo}/issues/{index}/comments", g.listComments)
	route("POST /api/v1/repos/{owner}/{repo}/issues/{index}/comments", g.createComment)
	route("PATCH /api/v1/repos/{owner}/{repo}/issues/comments/{id}", g.editComment)
	route("POST /api/v1/repos/{owner}/{repo}/statuses/{sha}", g.createStatus)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusNotFound, giteaMsg("Not Found")) })
	g.Server = httptest.NewServer(mux)
	t.Cleanup(g.Close)
	return g
}

func giteaMsg(m string) any { return map[string]string{"message": m, "url": "/api/swagger"} }

// AddPR makes pull request index of repo exist with head sha.
func (g *Gitea) AddPR(repo string, index int, sha string) {
	g.mu.Lock()
	g.prs[prKey(repo, index)] = sha
	g.mu.Unlock()
}

// DeletePR makes pull request index of repo, and its comments, vanish:
// every call about it answers 404 from now on.
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

// wrap checks the token, logs the request and applies a fault.
func (g *Gitea) wrap(route string, h func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		ft := g.note(r, route, auth)
		if auth != "token "+g.Token {
			writeJSON(w, http.StatusUnauthorized, giteaMsg("token is required"))
			return
		}
		if ft != nil && !ft.After {
			writeFault(w, ft, giteaMsg)
			return
		}
		if ft != nil {
			h(&recorder{header: http.Header{}}, r)
			writeFault(w, ft, giteaMsg)
			return
		}
		h(w, r)
	}
}

func (g *Gitea) pr(r *http.Request) (repo string, index int, sha string, ok bool) {
	repo = r.PathValue("owner") + "/" + r.PathValue("repo")
	index, _ = strconv.Atoi(r.PathValue("index"))
	sha, ok = g.prs[prKey(repo, index)]
	return repo, index, sha, ok
}

func (g *Gitea) getPull(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	_, index, sha, ok := g.pr(r)
	g.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, giteaMsg("pull request does not exist"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"number": index, "state": "open",
		"head": map[string]any{"sha": sha, "ref": "agent/task"},
	})
}

func (g *Gitea) commentJSON(c *GiteaComment) any {
	now := time.Now().UTC().Format(time.RFC3339)
	return map[string]any{
		"id": c.ID, "body": c.Body, "user": map[string]any{"login": c.Author},
		"html_url":   fmt.Sprintf("%s/%s/pulls/%d#issuecomment-%d", g.URL, c.Repo, c.Index, c.ID),
		"created_at": now, "updated_at": now,
	}
}

func (g *Gitea) listComments(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	repo, index, _, ok := g.pr(r)
	if !ok {
		writeJSON(w, http.StatusNotFound, giteaMsg("issue does not exist"))
		return
	}
	out := []any{}
	for _, c := range g.comments {
		if c.Repo == repo && c.Index == index {
			out = append(out, g.commentJSON(c))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (g *Gitea) createComment(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Body string `json:"body"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Body == "" {
		writeJSON(w, http.StatusUnprocessableEntity, giteaMsg("[Body]: Required"))
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	repo, index, _, ok := g.pr(r)
	if !ok {
		writeJSON(w, http.StatusNotFound, giteaMsg("issue does not exist"))
		return
	}
	g.nextID++
	c := &GiteaComment{ID: g.nextID, Repo: repo, Index: index, Author: g.User, Body: body.Body, Bodies: []string{body.Body}}
	g.comments = append(g.comments, c)
	writeJSON(w, http.StatusCreated, g.commentJSON(c))
}

func (g *Gitea) editComment(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Body string `json:"body"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Body == "" {
		writeJSON(w, http.StatusUnprocessableEntity, giteaMsg("[Body]: Required"))
		return
	}
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	repo := r.PathValue("owner") + "/" + r.PathValue("repo")
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.comments {
		if c.ID == id && c.Repo == repo {
			if c.Author != g.User {
				writeJSON(w, http.StatusForbidden, giteaMsg("user is not the poster"))
				return
			}
			c.Body = body.Body
			c.Bodies = append(c.Bodies, body.Body)
			writeJSON(w, http.StatusOK, g.commentJSON(c))
			return
		}
	}
	writeJSON(w, http.StatusNotFound, giteaMsg("comment does not exist"))
}

func (g *Gitea) createStatus(w http.ResponseWriter, r *http.Request) {
	var s GiteaStatus
	var body struct {
		State       string `json:"state"`
		TargetURL   string `json:"target_url"`
		Description string `json:"description"`
		Context     string `json:"context"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, giteaMsg(err.Error()))
		return
	}
	switch body.State {
	case "pending", "success", "error", "failure", "warning":
	default:
		writeJSON(w, http.StatusUnprocessableEntity, giteaMsg("[State]: invalid commit status state"))
		return
	}
	s = GiteaStatus{SHA: r.PathValue("sha"), State: body.State, Context: body.Context, TargetURL: body.TargetURL, Description: body.Description}
	g.mu.Lock()
	defer g.mu.Unlock()
	known := false
	for _, sha := range g.prs {
		known = known || sha == s.SHA
	}
	if !known {
		writeJSON(w, http.StatusNotFound, giteaMsg("commit does not exist"))
		return
	}
	g.statuses = append(g.statuses, s)
	writeJSON(w, http.StatusCreated, map[string]any{"id": len(g.statuses), "state": s.State, "context": s.Context, "target_url": s.TargetURL, "description": s.Description})
}
