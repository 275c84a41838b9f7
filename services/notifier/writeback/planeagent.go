package writeback

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/orch-dev/orch/proto"
)

// ActionEveryDefault is the least time between two action activities on
// one agent run: a tool call shown every few seconds tells a person the
// agent is at work without flooding the run.
const ActionEveryDefault = 3 * time.Second

// PlaneRuns is a client of Plane's agent runs (the Agents API, beta), as
// makeplane/plane-node-sdk calls it: POST
// /api/v1/workspaces/{slug}/runs/{run}/activities/ with the agent app's
// bot token as "Authorization: Bearer".
type PlaneRuns struct{ api }

// NewPlaneRuns returns a client of the agent runs of the Plane API at base
// with the app's bot token.
func NewPlaneRuns(base, botToken string, hc *http.Client) *PlaneRuns {
	return &PlaneRuns{api{name: "plane", base: base, authHeader: "Authorization", authValue: "Bearer " + botToken, http: hc}}
}

// RunActivity is one activity the agent posts on its run: Type thought,
// action, response, elicitation or error; an action names its tool
// (Action) and arguments (Parameters), every other type has a Body (text
// or HTML).
type RunActivity struct {
	Type       string
	Body       string
	Action     string
	Parameters map[string]string
}

// Post posts activity a on run of workspace. A thought or an action keeps
// the run in progress (a run with no activity for 5 minutes goes stale);
// a response settles it as completed, or as stopped once a person asked
// it to stop; an error as failed.
func (p *PlaneRuns) Post(ctx context.Context, workspace, run string, a RunActivity) error {
	content := map[string]any{"type": a.Type}
	if a.Type == "action" {
		content["action"], content["parameters"] = a.Action, cmpMap(a.Parameters)
	} else {
		content["body"] = a.Body
	}
	in := map[string]any{"type": a.Type, "content": content}
	path := "/workspaces/" + url.PathEscape(workspace) + "/runs/" + url.PathEscape(run) + "/activities/"
	return p.do(ctx, "posting "+a.Type+" activity", http.MethodPost, path, in, nil)
}

func cmpMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// agentRun reports the job on its Plane agent run: a thought as soon as
// the job is seen (queued or started), an action for the agent's newest
// tool call at most every ActionEvery while it runs, and once it ends
// the response (done, or cancelled: the run's stop) or the error. It
// returns when to look again for tool calls (zero: not before the job
// changes).
func (w *Writer) agentRun(ctx context.Context, h *held, t targets, st *proto.Status) (time.Time, error) {
	r := h.rec
	if r.RunFinal {
		return time.Time{}, nil
	}
	post := func(a RunActivity) error {
		if err := h.hold(ctx); err != nil {
			return err
		}
		err := w.cfg.PlaneRuns.Post(ctx, t.workspace, t.runID, a)
		w.count(TrackerPlane, OpRun, err)
		return err
	}
	link := ""
	if u := w.jobURL(st.Job.ID); u != "" {
		link = ` (<a href="` + html.EscapeString(u) + `">orch job ` + html.EscapeString(st.Job.ID) + `</a>)`
	}
	if !r.RunThought {
		body := "Queued as orch job " + st.Job.ID + "; a runner takes it up shortly."
		if st.State != proto.StateQueued && st.State != proto.StateHeld {
			body = "Working on it as orch job " + st.Job.ID + "."
		}
		if err := post(RunActivity{Type: "thought", Body: body}); err != nil {
			return time.Time{}, err
		}
		r.RunThought = true
		if err := h.save(ctx); err != nil {
			return time.Time{}, err
		}
	}
	ws := WorkspaceOf(st.Log)
	var final *RunActivity
	switch st.State {
	case proto.StateDone:
		final = &RunActivity{Type: "response", Body: "<p>" + html.EscapeString(cmpStr(w.cfg.Scrubber.Scrub(st.Result, ws), "Done.")) + "</p><p>Done" + link + ".</p>"}
	case proto.StateCancelled:
		final = &RunActivity{Type: "response", Body: "<p>Stopped: the job was cancelled" + link + ".</p>"}
	case proto.StateFailed:
		final = &RunActivity{Type: "error", Body: "The job failed: " + cmpStr(w.cfg.Scrubber.Scrub(st.Error, ws), "no error recorded") + "."}
	case proto.StateRunning, proto.StateRetrying:
		return w.runAction(ctx, h, st, post)
	}
	if final == nil {
		return time.Time{}, nil
	}
	if err := post(*final); err != nil {
		return time.Time{}, err
	}
	r.RunFinal = true
	return time.Time{}, h.save(ctx)
}

// runAction posts the agent's newest tool call, unless it was the last
// one posted or one was posted less than ActionEvery ago, and returns
// when to look again.
func (w *Writer) runAction(ctx context.Context, h *held, st *proto.Status, post func(RunActivity) error) (time.Time, error) {
	r := h.rec
	now := time.Now()
	if due := r.RunActionAt.Add(w.cfg.ActionEvery); now.Before(due) {
		return due, nil
	}
	next := now.Add(w.cfg.ActionEvery)
	tool, arg, ok := lastToolCall(w.cfg.LogTail(ctx, st))
	if !ok {
		return next, nil
	}
	arg = w.cfg.Scrubber.Scrub(arg, WorkspaceOf(st.Log))
	key := digest(tool + "\x00" + arg)
	if key == r.RunAction {
		return next, nil
	}
	if err := post(RunActivity{Type: "action", Action: tool, Parameters: map[string]string{"input": cut(arg, 500)}}); err != nil {
		return time.Time{}, err
	}
	r.RunAction, r.RunActionAt = key, time.Now() // after the post: the next waits from its end
	return next, h.save(ctx)
}

// lastToolCall finds the newest tool call in a rendered log: the
// runner's logstream writes each as "→ <tool>: <main argument>".
func lastToolCall(log string) (tool, arg string, ok bool) {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		rest, found := strings.CutPrefix(strings.TrimSpace(lines[i]), "→ ")
		if !found {
			continue
		}
		tool, arg, _ = strings.Cut(rest, ": ")
		if tool = strings.TrimSpace(tool); tool != "" {
			return tool, strings.TrimSpace(arg), true
		}
	}
	return "", "", false
}

func cmpStr(a, b string) string {
	if strings.TrimSpace(a) != "" {
		return a
	}
	return b
}
