package writeback

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/orch-dev/orch/proto"
)

// Plane is a client of the work item comments of Plane's API. The API key
// belongs to a workspace member who may comment in the projects served
// (the agent's member, ideally).
type Plane struct{ api }

// NewPlane returns a client of the Plane API at base (e.g.
// https://api.plane.so) with key.
func NewPlane(base, key string, hc *http.Client) *Plane {
	return &Plane{api{name: "plane", base: base, authHeader: "X-API-Key", authValue: key, http: hc}}
}

func commentsPath(workspace, project, item string) string {
	return "/workspaces/" + url.PathEscape(workspace) + "/projects/" + url.PathEscape(project) +
		"/issues/" + url.PathEscape(item) + "/comments/"
}

// CreateComment posts html on a work item as the tracking comment of job
// (external_source orch, external_id the job id) and returns its id. Plane
// refuses a second comment with the same external id in a project (409,
// naming the first): that comment's id is returned with created false, so a create repeated
// after a lost answer, or by a second notifier, never makes two comments.
func (p *Plane) CreateComment(ctx context.Context, workspace, project, item, job, html string) (id string, created bool, err error) {
	in := map[string]string{"comment_html": html, "external_source": proto.PlaneExternalSource, "external_id": job}
	var c struct {
		ID string `json:"id"`
	}
	err = p.do(ctx, "creating comment", http.MethodPost, commentsPath(workspace, project, item), in, &c)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Code == http.StatusConflict {
		var dup struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(apiErr.body, &dup) == nil && dup.ID != "" {
			return dup.ID, false, nil
		}
	}
	return c.ID, err == nil, err
}

// EditComment replaces the body of comment id on a work item.
func (p *Plane) EditComment(ctx context.Context, workspace, project, item, id, html string) error {
	return p.do(ctx, "editing comment", http.MethodPatch, commentsPath(workspace, project, item)+url.PathEscape(id)+"/", map[string]string{"comment_html": html}, nil)
}
