package trackertest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// PlaneComment is a comment the fake Plane holds, with every body it had.
type PlaneComment struct {
	ID, Workspace, Project, Item string
	ExternalSource, ExternalID   string
	HTML                         string
	// Bodies lists comment_html after the create and after each edit.
	Bodies []string
}

// Plane is a fake Plane API under /api/v1: work item comments (create,
// edit) with "X-API-Key: <Key>". A create whose external_source and
// external_id are already taken in the project answers 409 with the
// existing comment's id, as Plane's API does.
type Plane struct {
	*httptest.Server
	faults
	// Key is the only accepted API key.
	Key string

	mu       sync.Mutex
	items    map[string]bool // "workspace/project/item"
	comments []*PlaneComment
	nextID   int
}

// NewPlane starts a fake Plane for the test.
func NewPlane(t testing.TB, key string) *Plane {
	p := &Plane{Key: key, items: map[string]bool{}}
	mux := http.NewServeMux()
	route := func(pattern string, h func(http.ResponseWriter, *http.Request)) {
		mux.HandleFunc(pattern, p.wrap(pattern[len("POST "):], h))
	}
	route("POST /api/v1/workspaces/{slug}/projects/{project}/issues/{item}/comments/", p.onItem(p.create))
	// The same length prefix: "PATCH" is one letter longer, so route by hand.
	mux.HandleFunc("PATCH /api/v1/workspaces/{slug}/projects/{project}/issues/{item}/comments/{id}/",
		p.wrap("/api/v1/workspaces/{slug}/projects/{project}/issues/{item}/comments/{id}/", p.onItem(p.edit)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, planeMsg("Page not found."))
	})
	p.Server = httptest.NewServer(mux)
	t.Cleanup(p.Close)
	return p
}

func planeMsg(m string) any { return map[string]string{"error": m} }

// AddItem makes work item item of project in workspace exist.
func (p *Plane) AddItem(workspace, project, item string) {
	p.mu.Lock()
	p.items[workspace+"/"+project+"/"+item] = true
	p.mu.Unlock()
}

// DeleteItem makes a work item vanish: calls about it answer 404.
func (p *Plane) DeleteItem(workspace, project, item string) {
	p.mu.Lock()
	delete(p.items, workspace+"/"+project+"/"+item)
	p.mu.Unlock()
}

// Comments returns copies of the comments on a work item.
func (p *Plane) Comments(item string) []PlaneComment {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PlaneComment
	for _, c := range p.comments {
		if c.Item == item {
			cc := *c
			cc.Bodies = append([]string(nil), c.Bodies...)
			out = append(out, cc)
		}
	}
	return out
}

func (p *Plane) wrap(route string, h func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		ft := p.note(r, route, key)
		if key != p.Key {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "Authentication credentials were not provided."})
			return
		}
		answer(w, r, ft, h, planeMsg)
	}
}

type planeBody struct {
	CommentHTML    *string `json:"comment_html"`
	ExternalSource *string `json:"external_source"`
	ExternalID     *string `json:"external_id"`
}

func (p *Plane) item(r *http.Request) (ws, project, item string, ok bool) {
	ws, project, item = r.PathValue("slug"), r.PathValue("project"), r.PathValue("item")
	return ws, project, item, p.items[ws+"/"+project+"/"+item]
}

func commentJSON(c *PlaneComment) any {
	return map[string]any{
		"id": c.ID, "comment_html": c.HTML, "issue": c.Item, "project": c.Project,
		"external_source": c.ExternalSource, "external_id": c.ExternalID, "access": "INTERNAL",
	}
}

// onItem reads a comment create or edit of a work item and hands it to h
// with the fake locked. A body that is not JSON answers 400, an item the
// fake does not have 404, as Plane does.
func (p *Plane) onItem(h func(w http.ResponseWriter, r *http.Request, b planeBody, ws, project, item string)) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		var b planeBody
		if err := decode(r, &b); err != nil {
			writeJSON(w, http.StatusBadRequest, planeMsg("Invalid JSON"))
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		ws, project, item, ok := p.item(r)
		if !ok {
			writeJSON(w, http.StatusNotFound, planeMsg(planeNotFound))
			return
		}
		h(w, r, b, ws, project, item)
	}
}

// planeNotFound is Plane's message for a work item or comment it does not
// have.
const planeNotFound = "The requested resource does not exist."

func (p *Plane) create(w http.ResponseWriter, r *http.Request, b planeBody, ws, project, item string) {
	if b.CommentHTML == nil || *b.CommentHTML == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"comment_html": []string{"This field is required."}})
		return
	}
	src, ext := deref(b.ExternalSource), deref(b.ExternalID)
	if src != "" && ext != "" {
		for _, c := range p.comments {
			if c.Project == project && c.ExternalSource == src && c.ExternalID == ext {
				writeJSON(w, http.StatusConflict, map[string]string{
					"error": "Work item comment with the same external id and external source already exists",
					"id":    c.ID,
				})
				return
			}
		}
	}
	p.nextID++
	c := &PlaneComment{
		ID: fmt.Sprintf("0c0ffee0-0000-4000-8000-%012d", p.nextID), Workspace: ws, Project: project, Item: item,
		ExternalSource: src, ExternalID: ext, HTML: *b.CommentHTML, Bodies: []string{*b.CommentHTML},
	}
	p.comments = append(p.comments, c)
	writeJSON(w, http.StatusCreated, commentJSON(c))
}

func (p *Plane) edit(w http.ResponseWriter, r *http.Request, b planeBody, _, _, item string) {
	for _, c := range p.comments {
		if c.ID == r.PathValue("id") && c.Item == item {
			if b.CommentHTML != nil {
				c.HTML = *b.CommentHTML
				c.Bodies = append(c.Bodies, c.HTML)
			}
			writeJSON(w, http.StatusOK, commentJSON(c))
			return
		}
	}
	writeJSON(w, http.StatusNotFound, planeMsg(planeNotFound))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
