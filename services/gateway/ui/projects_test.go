package ui_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/jobs"
)

// api calls the JSON API with the token.
func (e *env) api(method, path string) answer {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	return e.client().do(req)
}

// projectLine reads GET /queue's line of project key.
func (e *env) projectLine(key string) jobs.ProjectFigures {
	e.t.Helper()
	a := e.api(http.MethodGet, "/queue")
	var sum jobs.Summary
	if err := json.Unmarshal([]byte(a.body), &sum); err != nil {
		e.t.Fatalf("GET /queue: %d %v %s", a.code, err, a.body)
	}
	for _, p := range sum.Projects {
		if p.Key == key {
			return p
		}
	}
	e.t.Fatalf("GET /queue has no line for %s: %s", key, a.body)
	return jobs.ProjectFigures{}
}

// GET /queue and the dashboard show queued, running and held jobs per
// project; the job list names each task by its title.
func TestQueueShowsProjectsAndTitles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	e.put(proto.Status{Job: job("w1", "pr-42", "Fix the flux capacitor"), State: proto.StateQueued})
	e.put(proto.Status{Job: job("w2", "pr-42", "Fix the flux capacitor"), State: proto.StateRunning, Attempt: 1})
	e.put(proto.Status{Job: job("w3", "pr-43", "Add a warp coil"), State: proto.StateQueued})
	g := job("g1", "pr-7", "Polish gadgets")
	g.Project = "gadgets"
	e.put(proto.Status{Job: g, State: proto.StateHeld, HeldReason: proto.HoldOperator})
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if w := e.projectLine("widgets"); w.Queued != 2 || w.Running != 1 || w.Held != 0 {
			return errors.New("widgets: " + mustJSON(w))
		}
		if g := e.projectLine("gadgets"); g.Queued != 0 || g.Running != 0 || g.Held != 1 {
			return errors.New("gadgets: " + mustJSON(g))
		}
		return nil
	})
	c := e.loggedIn()
	page := c.waitPage("/ui/", "Add a warp coil")
	for _, want := range []string{`data-project="widgets"`, `<td data-label="Queued">2</td>`, `<td data-label="Held">1</td>`, "Fix the flux capacitor", "widgets/pr-43"} {
		if !strings.Contains(page.body, want) {
			t.Errorf("queue page lacks %q", want)
		}
	}
}

// A queued job's record has no attempt limit yet: its page says the
// runners' (the runner consumer's MaxDeliver), "attempt 0 of 3".
func TestQueuedJobPageSaysAttemptZeroOfMaxAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	ctx := context.Background()
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		_, err := e.js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(2, 3, 30*time.Second))
		return err
	})
	j := job("q1", "pr-9", "Wait your turn")
	data, _ := json.Marshal(proto.Status{Schema: proto.SchemaVersion, Job: j, State: proto.StateQueued, UpdatedAt: time.Now().UTC()})
	if _, err := e.kv.Put(ctx, j.ID, data); err != nil {
		t.Fatal(err)
	}
	c := e.loggedIn()
	c.waitPage("/ui/jobs/q1", "<dd>0 of 3</dd>")
}

// An operator pauses a project from the dashboard (and the API): the
// pause is a key of the pauses bucket, reason operator, shown on the
// queue page and GET /queue until resumed.
func TestPauseAndResumeAProject(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	c := e.loggedIn()
	c.waitPage("/ui/", `action="/ui/projects/widgets/pause"`)
	token := c.csrf("/ui/")
	if a := c.post("/ui/projects/widgets/pause", url.Values{}); a.code != http.StatusForbidden {
		t.Errorf("pause without CSRF: %d", a.code)
	}
	if a := c.post("/ui/projects/widgets/pause", url.Values{"csrf": {token}}); a.code != http.StatusSeeOther {
		t.Fatalf("pause: %d %s", a.code, a.body)
	}
	kv, err := e.js.KeyValue(context.Background(), proto.BucketPauses)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := kv.Get(context.Background(), proto.ProjectPauseKey("widgets"))
	if err != nil {
		t.Fatalf("no pause key after pausing: %v", err)
	}
	if pz, err := proto.DecodePause(ent.Value()); err != nil || pz.Reason != proto.HoldOperator || pz.By != "dashboard" {
		t.Errorf("pause %s (%v), want reason operator by dashboard", ent.Value(), err)
	}
	page := c.waitPage("/ui/", `action="/ui/projects/widgets/resume"`)
	if !strings.Contains(page.body, "paused") {
		t.Errorf("queue page does not say widgets is paused")
	}
	if p := e.projectLine("widgets"); p.Paused == nil || p.Paused.Reason != proto.HoldOperator {
		t.Errorf("GET /queue: widgets %s, want paused", mustJSON(p))
	}
	if p := e.projectLine("gadgets"); p.Paused != nil {
		t.Errorf("GET /queue: gadgets %s, want not paused", mustJSON(p))
	}

	// The API resumes it, and pauses it again; an unknown project is 404
	// and the token is needed.
	if a := e.api(http.MethodPost, "/projects/widgets/resume"); a.code != http.StatusOK || !strings.Contains(a.body, `"paused":false`) {
		t.Errorf("resume: %d %s", a.code, a.body)
	}
	if _, err := kv.Get(context.Background(), proto.ProjectPauseKey("widgets")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("pause key after resume: %v", err)
	}
	if a := e.api(http.MethodPost, "/projects/widgets/pause"); a.code != http.StatusOK || !strings.Contains(a.body, `"paused":true`) {
		t.Errorf("pause by API: %d %s", a.code, a.body)
	}
	if a := e.api(http.MethodPost, "/projects/nope/pause"); a.code != http.StatusNotFound {
		t.Errorf("pause of an unknown project: %d %s", a.code, a.body)
	}
	req, _ := http.NewRequest(http.MethodPost, e.url+"/projects/widgets/resume", nil)
	if a := e.client().do(req); a.code != http.StatusUnauthorized {
		t.Errorf("resume without the token: %d", a.code)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
