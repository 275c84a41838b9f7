package trackertest

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// PlaneComment is a comment the fake Plane holds, with every body it had.
type PlaneComment struct {
	ID, Workspace, Project, Item string
	ExternalSource, ExternalID   string
	HTML                         string
	// Bodies lists comment_html after the create and after each edit.
	Bodies []string
}

// Plane is a fake Plane API under /api/v1, answering as Plane's own
// views do (apps/api/plane/api in makeplane/plane): projects and work
// items (read), work item comments (create, edit) with "X-Api-Key:
// <Key>", and the agent runs of an app (see planeagent.go) with
// "Authorization: Bearer <BotToken>".
//
// A comment create checks for a comment of the same external_source and
// external_id in the project and answers 409 with its id, as Plane's view
// does; like that view, it checks and then inserts, with no constraint in
// between: two creates at once can both succeed (see BetweenCheckAndInsert).
// Requests with an API key are limited per key as Plane's
// ApiKeyRateThrottle does (RateLimit a minute, default 60): past it, 429
// with Retry-After and DRF's "detail".
type Plane struct {
	*httptest.Server
	faults
	// Key is the only accepted API key.
	Key string
	// BotToken is the only accepted bearer token of the agent app.
	BotToken string
	// RateLimit is how many requests a key may make in a minute; set it
	// before the first request. Zero means PlaneRateLimitDefault; negative
	// turns the limit off.
	RateLimit int
	// Now is the clock of the rate limit; nil is time.Now.
	Now func() time.Time
	// BetweenCheckAndInsert, when set, is called by a comment create
	// after its check for an existing external id and before its insert,
	// with the fake unlocked: a test holds creates there to let another
	// pass the same check.
	BetweenCheckAndInsert func(item string)

	mu       sync.Mutex
	items    map[string]int    // "workspace/project/item" -> sequence id
	idents   map[string]string // "workspace/project" -> identifier
	comments []*PlaneComment
	nextID   int
	history  map[string][]time.Time // per key, newest first, as DRF keeps it
	runs     map[string]*PlaneRun
}

// PlaneRateLimitDefault is Plane's API_KEY_RATE_LIMIT default, 60/minute.
const PlaneRateLimitDefault = 60

// NewPlane starts a fake Plane for the test.
func NewPlane(t testing.TB, key string) *Plane {
	p := &Plane{Key: key, BotToken: key + "-bot", items: map[string]int{}, idents: map[string]string{},
		history: map[string][]time.Time{}, runs: map[string]*PlaneRun{}}
	mux := http.NewServeMux()
	route := func(method, pattern string, h func(http.ResponseWriter, *http.Request)) {
		mux.HandleFunc(method+" "+pattern, p.wrap(pattern, h))
	}
	const item = "/api/v1/workspaces/{slug}/projects/{project}/issues/{item}/"
	route("GET", "/api/v1/workspaces/{slug}/projects/{project}/", p.project)
	route("GET", item, p.workItem)
	route("POST", item+"comments/", p.onItem(p.create))
	route("PATCH", item+"comments/{id}/", p.onItem(p.edit))
	p.agentRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, planeMsg("Page not found."))
	})
	p.Server = httptest.NewServer(mux)
	t.Cleanup(p.Close)
	return p
}

func planeMsg(m string) any { return map[string]string{"error": m} }

// SetIdentifier makes project of workspace exist with identifier (e.g.
// WID): GET on the project answers it.
func (p *Plane) SetIdentifier(workspace, project, identifier string) {
	p.mu.Lock()
	p.idents[workspace+"/"+project] = identifier
	p.mu.Unlock()
}

// AddItem makes work item item of project in workspace exist, with the
// project's next sequence id, which it returns.
func (p *Plane) AddItem(workspace, project, item string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := 1
	prefix := workspace + "/" + project + "/"
	for k, n := range p.items {
		if strings.HasPrefix(k, prefix) && n >= seq {
			seq = n + 1
		}
	}
	p.items[prefix+item] = seq
	return seq
}

// AddItemSeq makes work item item exist with sequence id seq.
func (p *Plane) AddItemSeq(workspace, project, item string, seq int) {
	p.mu.Lock()
	p.items[workspace+"/"+project+"/"+item] = seq
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
		key := r.Header.Get("X-Api-Key")
		ft := p.note(r, route, key)
		if key != p.Key {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "Authentication credentials were not provided."})
			return
		}
		if wait, ok := p.throttle(key); !ok {
			// DRF's Throttled: Retry-After in whole seconds, and "detail".
			secs := int(math.Ceil(wait.Seconds()))
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			writeJSON(w, http.StatusTooManyRequests, map[string]string{
				"detail": fmt.Sprintf("Request was throttled. Expected available in %d seconds.", secs)})
			return
		}
		answer(w, r, ft, h, planeMsg)
	}
}

// throttle counts a request of key as DRF's SimpleRateThrottle does: a
// sliding minute of request times; a request over the limit is refused
// with the wait DRF computes (the time until the oldest request leaves
// the window, spread over the requests then available).
func (p *Plane) throttle(key string) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	limit := cmp.Or(p.RateLimit, PlaneRateLimitDefault)
	if limit < 0 {
		return 0, true
	}
	now := time.Now()
	if p.Now != nil {
		now = p.Now()
	}
	h := p.history[key]
	for len(h) > 0 && !h[len(h)-1].After(now.Add(-time.Minute)) {
		h = h[:len(h)-1]
	}
	if len(h) >= limit {
		p.history[key] = h
		remaining := time.Minute - now.Sub(h[len(h)-1])
		return remaining / time.Duration(limit-len(h)+1), false
	}
	p.history[key] = append([]time.Time{now}, h...)
	return 0, true
}

// project answers GET on a project: its id and identifier.
func (p *Plane) project(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	ident, ok := p.idents[r.PathValue("slug")+"/"+r.PathValue("project")]
	p.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, planeMsg(planeNotFound))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": r.PathValue("project"), "identifier": ident, "name": ident})
}

// workItem answers GET on a work item: IssueSerializer's fields orch
// reads (no project identifier: Plane does not send one).
func (p *Plane) workItem(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	seq, ok := p.items[r.PathValue("slug")+"/"+r.PathValue("project")+"/"+r.PathValue("item")]
	p.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, planeMsg(planeNotFound))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": r.PathValue("item"), "sequence_id": seq, "project": r.PathValue("project")})
}

type planeBody struct {
	CommentHTML    *string `json:"comment_html"`
	ExternalSource *string `json:"external_source"`
	ExternalID     *string `json:"external_id"`
}

func (p *Plane) item(r *http.Request) (ws, project, item string, ok bool) {
	ws, project, item = r.PathValue("slug"), r.PathValue("project"), r.PathValue("item")
	_, ok = p.items[ws+"/"+project+"/"+item]
	return ws, project, item, ok
}

func commentJSON(c *PlaneComment) any {
	return map[string]any{
		"id": c.ID, "comment_html": c.HTML, "issue": c.Item, "project": c.Project,
		"external_source": c.ExternalSource, "external_id": c.ExternalID, "access": "INTERNAL",
	}
}

// onItem reads a comment create or edit of a work item and hands it to h,
// which locks the fake itself. A body that is not JSON answers 400, an
// item the fake does not have 404, as Plane does.
func (p *Plane) onItem(h func(w http.ResponseWriter, r *http.Request, b planeBody, ws, project, item string)) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		var b planeBody
		if err := decode(r, &b); err != nil {
			writeJSON(w, http.StatusBadRequest, planeMsg("Invalid JSON"))
			return
		}
		p.mu.Lock()
		ws, project, item, ok := p.item(r)
		p.mu.Unlock()
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
	p.mu.Lock()
	if src != "" && ext != "" {
		for _, c := range p.comments {
			if c.Project == project && c.ExternalSource == src && c.ExternalID == ext {
				p.mu.Unlock()
				writeJSON(w, http.StatusConflict, map[string]string{
					"error": "Work item comment with the same external id and external source already exists",
					"id":    c.ID,
				})
				return
			}
		}
	}
	between := p.BetweenCheckAndInsert
	p.mu.Unlock()
	// Plane's view checks, then inserts: no constraint holds between.
	if between != nil {
		between(item)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextID++
	c := &PlaneComment{
		ID: fmt.Sprintf("0c0ffee0-0000-4000-8000-%012d", p.nextID), Workspace: ws, Project: project, Item: item,
		ExternalSource: src, ExternalID: ext, HTML: *b.CommentHTML, Bodies: []string{*b.CommentHTML},
	}
	p.comments = append(p.comments, c)
	writeJSON(w, http.StatusCreated, commentJSON(c))
}

func (p *Plane) edit(w http.ResponseWriter, r *http.Request, b planeBody, _, _, item string) {
	p.mu.Lock()
	defer p.mu.Unlock()
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
