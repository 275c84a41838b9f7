// Package planenames finds the readable name of a Plane work item (WID-41)
// for a delivery whose payload names the item only by its id.
//
// Plane's webhooks carry no project identifier: an issue's payload
// (IssueExpandSerializer, fields "__all__") has the item's sequence_id and
// the project's id, a comment's (IssueCommentSerializer) only the item's
// id. The resolver asks Plane's API for the project's identifier (cached
// per project) and, for a comment, the item's sequence id (cached per
// item: it never changes), within a short budget, so that the webhook is
// answered at once whatever Plane's API does.
//
// One work item is never two tasks: the name its jobs already carry (the
// gateway's index of job records) wins over anything the API says, so an
// item first named by its id, because the API was away, keeps that name
// for its later events. See docs/gateway.md, "Plane item names".
package planenames

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// Defaults of a Resolver.
const (
	// BudgetDefault bounds the API calls made for one delivery. Plane
	// waits for the answer (30 s) and never sends again after it, so the
	// webhook must not wait long; past the budget the delivery keeps the
	// item's id.
	BudgetDefault = 1500 * time.Millisecond
	// HoldDefault is how long the API is left alone after a 429 that
	// names no Retry-After: Plane's limit is counted per minute.
	HoldDefault = time.Minute
	// MaxItemsDefault bounds the item names kept in memory.
	MaxItemsDefault = 10000
)

// Config configures a Resolver. URL and Token are ORCH_PLANE_URL and
// ORCH_PLANE_TOKEN (the notifier's write-back key does for both: it reads
// projects and work items).
type Config struct {
	// URL is Plane's base URL (https://api.plane.so); empty: no lookups.
	URL string
	// Token is the API key, sent as X-Api-Key.
	Token string
	// HTTP is the client; nil: one without a timeout of its own (the
	// budget bounds each call).
	HTTP *http.Client
	// Budget bounds the lookups of one delivery; zero: BudgetDefault.
	Budget time.Duration
	// Known returns the task name the project's jobs of a work item
	// already carry (the gateway's index); nil knows none.
	Known func(project, item string) (string, bool)
	// Now is the clock of the rate limit's hold; nil: time.Now.
	Now func() time.Time
	Log *zap.Logger
}

// Resolver finds work items' readable names. It is safe for concurrent
// use; a nil *Resolver finds none.
type Resolver struct {
	cfg Config

	mu     sync.Mutex
	idents map[string]string // Plane project id -> identifier
	items  map[string]string // work item id -> readable name
	told   map[string]bool   // projects whose fallback to ids was logged
	hold   time.Time         // no calls before it (a 429)
}

// New returns a Resolver.
func New(cfg Config) *Resolver {
	if cfg.Budget <= 0 {
		cfg.Budget = BudgetDefault
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Resolver{cfg: cfg, idents: map[string]string{}, items: map[string]string{}, told: map[string]bool{}}
}

// Name returns the readable name (WID-41) of the work item a Plane
// delivery is about, for trigger.PlaneNamed; "" keeps the item's id as
// the task's name: the delivery is not about a work item of a registered
// project, the item's jobs are already named by its id, or Plane's API
// is not set up, refuses, is slow or asks to wait (logged once per
// project).
func (r *Resolver) Name(ctx context.Context, reg *registry.Registry, eventHeader string, body []byte) string {
	if r == nil {
		return ""
	}
	ev, err := webhook.ParsePlane(eventHeader, body)
	if err != nil {
		return "" // the trigger says what is wrong with it
	}
	var project, item, ident string
	seq := 0
	switch {
	case ev.Issue != nil:
		project, item, seq, ident = ev.Issue.Project, ev.Issue.ID, ev.Issue.SequenceID, ev.Issue.Identifier()
	case ev.Comment != nil:
		project, item = ev.Comment.Project, ev.Comment.Issue
	default:
		return ""
	}
	return r.name(ctx, reg, project, item, seq, ident)
}

// NameAgent is Name for a delivery of a Plane agent app (its runs name
// the project and the work item by id).
func (r *Resolver) NameAgent(ctx context.Context, reg *registry.Registry, body []byte) string {
	if r == nil {
		return ""
	}
	ev, err := webhook.ParsePlaneAgent(body)
	if err != nil || ev.Item() == "" {
		return ""
	}
	return r.name(ctx, reg, ev.Project(), ev.Item(), 0, "")
}

// name finds the name of item of Plane project project; seq and ident
// are what the payload says of them (zero, empty: nothing).
func (r *Resolver) name(ctx context.Context, reg *registry.Registry, project, item string, seq int, ident string) string {
	p, ok := reg.ByPlaneProject(project)
	if !ok {
		return ""
	}
	if r.cfg.Known != nil {
		if name, ok := r.cfg.Known(p.Key, item); ok {
			if name == proto.Token(item) {
				return "" // named by its id before: it stays so
			}
			return name
		}
	}
	r.mu.Lock()
	name, ok := r.items[item]
	r.mu.Unlock()
	if ok {
		return name
	}
	if ident != "" && seq > 0 {
		return r.remember(item, ident+"-"+strconv.Itoa(seq))
	}
	switch {
	case r.cfg.URL == "" || r.cfg.Token == "":
		r.fallback(p, "ORCH_PLANE_URL or ORCH_PLANE_TOKEN is not set", nil)
		return ""
	case p.PlaneWorkspace == "":
		r.fallback(p, "the project has no plane_workspace (the workspace slug Plane's API needs)", nil)
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Budget)
	defer cancel()
	name, err := r.lookup(ctx, p, project, item, seq)
	if err != nil {
		r.fallback(p, "Plane's API did not answer with the item's identifier", err)
		return ""
	}
	r.mu.Lock()
	delete(r.told, p.Key)
	r.mu.Unlock()
	return r.remember(item, name)
}

// remember keeps an item's name, dropping all once MaxItemsDefault are
// kept: a name lost is asked again, and the index keeps the names of
// items with jobs.
func (r *Resolver) remember(item, name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.items) >= MaxItemsDefault {
		clear(r.items)
	}
	r.items[item] = name
	return name
}

// fallback logs, once per project until a lookup for it succeeds, that
// its tasks are named by their items' ids.
func (r *Resolver) fallback(p *registry.Project, why string, err error) {
	r.mu.Lock()
	told := r.told[p.Key]
	r.told[p.Key] = true
	r.mu.Unlock()
	if told {
		return
	}
	fields := []zap.Field{zap.String("project", p.Key), zap.String("reason", why)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	r.cfg.Log.Warn("plane work items named by their ids, not as WID-41 (logged once per project)", fields...)
}

// errHeld is the lookup refused while Plane's rate limit is waited out.
var errHeld = errors.New("holding off Plane's API after a 429")

// lookup asks Plane's API for the project's identifier and, without seq,
// the item's sequence id.
func (r *Resolver) lookup(ctx context.Context, p *registry.Project, project, item string, seq int) (string, error) {
	r.mu.Lock()
	ident, held := r.idents[project], r.cfg.Now().Before(r.hold)
	r.mu.Unlock()
	if held {
		return "", errHeld
	}
	ws := "/api/v1/workspaces/" + url.PathEscape(p.PlaneWorkspace) + "/projects/" + url.PathEscape(project) + "/"
	if ident == "" {
		var pr struct {
			Identifier string `json:"identifier"`
		}
		if err := r.get(ctx, ws, &pr); err != nil {
			return "", fmt.Errorf("reading project: %w", err)
		}
		if pr.Identifier == "" {
			return "", errors.New("reading project: no identifier in Plane's answer")
		}
		ident = pr.Identifier
		r.mu.Lock()
		r.idents[project] = ident
		r.mu.Unlock()
	}
	if seq <= 0 {
		var is struct {
			SequenceID int `json:"sequence_id"`
		}
		if err := r.get(ctx, ws+"issues/"+url.PathEscape(item)+"/", &is); err != nil {
			return "", fmt.Errorf("reading work item: %w", err)
		}
		if is.SequenceID <= 0 {
			return "", errors.New("reading work item: no sequence_id in Plane's answer")
		}
		seq = is.SequenceID
	}
	return ident + "-" + strconv.Itoa(seq), nil
}

// get reads one JSON answer. A 429 holds every lookup off for its
// Retry-After (HoldDefault without one).
func (r *Resolver) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.cfg.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Api-Key", r.cfg.Token)
	req.Header.Set("Accept", "application/json")
	resp, err := r.cfg.HTTP.Do(req)
	if err != nil {
		return err // names the URL, never the key (a header)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("reading answer: %w", err)
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		wait := retryAfter(resp.Header.Get("Retry-After"), r.cfg.Now())
		if wait <= 0 {
			wait = HoldDefault
		}
		r.mu.Lock()
		r.hold = r.cfg.Now().Add(wait)
		r.mu.Unlock()
		return fmt.Errorf("HTTP 429 (rate limited, holding off for %s): %s", wait, errorText(data))
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorText(data))
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding answer: %w", err)
	}
	return nil
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now)
	}
	return 0
}

// errorText is Plane's message: "error" or "detail" (DRF's), else the
// start of the body.
func errorText(data []byte) string {
	var m struct{ Error, Detail string }
	if json.Unmarshal(data, &m) == nil && cmp.Or(m.Error, m.Detail) != "" {
		return cmp.Or(m.Error, m.Detail)
	}
	s := strings.TrimSpace(string(data))
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
