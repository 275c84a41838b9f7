package writeback

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/alert"
)

// targets are the places one job is written to.
type targets struct {
	giteaComment, giteaStatus, plane bool
	repo                             string
	pr                               int
	workspace, project, item         string
	// run says the job answers a Plane agent run, runID.
	run   bool
	runID string
}

func (t targets) any() bool      { return t.giteaComment || t.giteaStatus || t.plane || t.run }
func (t targets) comments() bool { return t.giteaComment || t.plane }

// targetsOf says where job is written: the Gitea pull request of its task
// and the Plane work item, each where the tracker is set up and the
// project's writeback key asks for it.
func (w *Writer) targetsOf(p *registry.Project, job *proto.Job) targets {
	t := targets{repo: p.GiteaRepo, pr: job.Task.PR, workspace: p.PlaneWorkspace, project: p.PlaneProject, item: job.Task.PlaneItem}
	gitea := w.cfg.Gitea != nil && p.GiteaRepo != "" && job.Task.PR > 0
	t.giteaComment = gitea && p.WritesComment()
	t.giteaStatus = gitea && p.WritesStatus()
	t.plane = w.cfg.Plane != nil && p.PlaneProject != "" && p.PlaneWorkspace != "" && job.Task.PlaneItem != "" && p.WritesComment()
	t.run, t.runID = w.cfg.PlaneRuns != nil && p.PlaneAgentApp && p.PlaneWorkspace != "" && job.Task.PlaneRun != "", job.Task.PlaneRun
	if t.run {
		t.plane = false // the run's response is the answer in its thread
	}
	return t
}

// outcome is what one sync left: when to come back (zero: not until the
// job changes), and whether a tracker failed.
type outcome struct {
	next   time.Time
	failed bool
}

// sync brings the job's comment and commit status up to st, revision rev
// of its record. fails counts the failures in a row before it.
func (w *Writer) sync(ctx context.Context, st *proto.Status, rev uint64, fails int) outcome {
	id := st.Job.ID
	log := w.log.With(zap.String("job", id))
	p, ok := w.cfg.Registry().ByKey(st.Job.Project)
	if !ok {
		return outcome{}
	}
	t := w.targetsOf(p, &st.Job)
	rec, rrev, err := w.recs.get(ctx, id)
	if err != nil {
		log.Warn("write-back: reading record", zap.Error(err))
		return outcome{next: time.Now().Add(w.backoff(fails)), failed: true}
	}
	// A running job of an agent run is looked at again without a change
	// of its record: its tool calls are in the log.
	polling := t.run && !rec.RunFinal && (st.State == proto.StateRunning || st.State == proto.StateRetrying)
	if rec.Stopped != "" || rec.Rev >= rev && !polling {
		return outcome{}
	}
	now := time.Now()
	if rec.Owner != "" && rec.Owner != w.cfg.Name && rec.LeaseUntil.After(now) {
		return outcome{next: rec.LeaseUntil} // another notifier writes it
	}
	h := &held{records: w.recs, id: id, rec: rec, rev: rrev, owner: w.cfg.Name, lease: w.cfg.Lease}
	if err := h.save(ctx); err != nil {
		// Another notifier took it a moment ago: look again soon.
		return outcome{next: now.Add(w.cfg.MinEdit)}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = h.release(rctx)
	}()

	written := rec.GiteaComment != 0 || rec.PlaneComment != "" || rec.StatusKey != ""
	if written && now.Before(rec.EditedAt.Add(w.cfg.MinEdit)) {
		return outcome{next: rec.EditedAt.Add(w.cfg.MinEdit)} // coalesce
	}
	view := w.view(ctx, st)
	complete := true
	showComment := rec.GiteaComment != 0 || rec.PlaneComment != "" || w.commentDue(st, now)
	var next time.Time
	if t.comments() && !showComment {
		complete = false
		if st.State == proto.StateQueued {
			next = st.Job.CreatedAt.Add(w.cfg.QueuedAfter)
		}
	}
	steps := []func() error{}
	if t.giteaStatus {
		steps = append(steps, func() error { return w.giteaStatus(ctx, h, t, st) })
	}
	if t.giteaComment && showComment {
		steps = append(steps, func() error { return w.giteaComment(ctx, h, t, view) })
	}
	if t.plane && showComment {
		steps = append(steps, func() error { return w.planeComment(ctx, h, t, view) })
	}
	if t.run {
		steps = append(steps, func() error {
			again, err := w.agentRun(ctx, h, t, st)
			if !again.IsZero() && (next.IsZero() || again.Before(next)) {
				next = again
			}
			return err
		})
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return w.failure(ctx, log, h, err, fails)
		}
	}
	if complete {
		rec.Rev = rev
		if err := h.save(ctx); err != nil && !errors.Is(err, errLeaseLost) {
			return outcome{next: time.Now().Add(w.backoff(fails)), failed: true}
		}
	}
	if !next.IsZero() && !next.After(time.Now()) {
		next = time.Now()
	}
	return outcome{next: next}
}

// commentDue reports whether a job without a comment gets one now: once
// it has started, or after waiting QueuedAfter in the queue. A job
// cancelled before either gets none.
func (w *Writer) commentDue(st *proto.Status, now time.Time) bool {
	switch st.State {
	case proto.StateRunning, proto.StateRetrying, proto.StateDone, proto.StateFailed, proto.StateHeld:
		// A held job is told why at once: it may wait for hours.
		return true
	case proto.StateQueued:
		return !now.Before(st.Job.CreatedAt.Add(w.cfg.QueuedAfter))
	}
	return false
}

// view is what the comment shows of st, scrubbed of secrets and paths.
func (w *Writer) view(ctx context.Context, st *proto.Status) View {
	ws := WorkspaceOf(st.Log)
	shown := *st
	shown.Error = w.cfg.Scrubber.Scrub(st.Error, ws)
	shown.Result = w.cfg.Scrubber.Scrub(st.Result, ws)
	v := View{Status: &shown, JobURL: w.jobURL(st.Job.ID)}
	if st.State == proto.StateFailed {
		v.LogTail = w.cfg.Scrubber.Scrub(alert.LastLines(w.cfg.LogTail(ctx, st), LogTailLines), ws)
	}
	return v
}

// failure turns a failed step into when to try again. A 404 ends the
// job's write-back for good, with one log line; a lost lease leaves the
// job to its new holder.
func (w *Writer) failure(ctx context.Context, log *zap.Logger, h *held, err error, fails int) outcome {
	var apiErr *APIError
	switch {
	case errors.Is(err, errLeaseLost):
		return outcome{next: time.Now().Add(w.cfg.Lease)}
	case errors.Is(err, ErrGone):
		log.Warn("write-back stopped for this job: the tracker no longer has it", zap.Error(err))
		h.rec.Stopped = err.Error()
		if serr := h.save(ctx); serr != nil {
			return outcome{next: time.Now().Add(w.backoff(fails)), failed: true}
		}
		return outcome{}
	case errors.As(err, &apiErr) && !apiErr.Retryable():
		log.Error("write-back refused by the tracker; check its token and permissions", zap.Error(err), zap.Duration("retry_in", w.cfg.RejectedDelay))
		return outcome{next: time.Now().Add(w.cfg.RejectedDelay), failed: true}
	}
	delay := w.backoff(fails)
	if errors.As(err, &apiErr) && apiErr.RetryAfter > 0 {
		delay = apiErr.RetryAfter
	}
	log.Warn("write-back failed, will retry", zap.Error(err), zap.Duration("retry_in", delay))
	return outcome{next: time.Now().Add(delay), failed: true}
}

// giteaStatus sets the commit status of the pull request's head (the one
// the job's event named, else the head Gitea reports now), unless it
// already shows st.
func (w *Writer) giteaStatus(ctx context.Context, h *held, t targets, st *proto.Status) error {
	cs := StatusOf(st, w.jobURL(st.Job.ID))
	key := cs.State + "|" + cs.Description
	if h.rec.StatusKey == key {
		return nil
	}
	if err := h.hold(ctx); err != nil {
		return err
	}
	if h.rec.SHA == "" {
		h.rec.SHA = st.Job.Task.HeadSHA
	}
	if h.rec.SHA == "" {
		sha, err := w.cfg.Gitea.PullHead(ctx, t.repo, t.pr)
		if err != nil {
			w.count(TrackerGitea, OpStatus, err)
			return err
		}
		h.rec.SHA = sha
	}
	err := w.cfg.Gitea.SetStatus(ctx, t.repo, h.rec.SHA, cs)
	w.count(TrackerGitea, OpStatus, err)
	if err != nil {
		return err
	}
	h.rec.StatusKey, h.rec.EditedAt = key, time.Now()
	return h.save(ctx)
}

// comment is one tracker's side of a job's tracking comment: the record
// fields that name it and remember what it shows, and the tracker's own
// way of finding or creating it. writeComment is the flow both share.
type comment[ID comparable] struct {
	tracker string // TrackerGitea or TrackerPlane, for the metrics
	body    string
	// id is the comment's id in the record (zero: none known yet); hash
	// is the digest of the body last written to it.
	id   *ID
	hash *string
	// ensure returns the job's comment, creating it with body where the
	// tracker has none; created says body is already what it shows. It
	// counts the requests it sends.
	ensure func(ctx context.Context) (id ID, created bool, err error)
	// edit replaces the body of comment id.
	edit func(ctx context.Context, id ID) error
}

// writeComment creates or edits the job's comment so that it shows
// c.body, unless it already does.
func writeComment[ID comparable](ctx context.Context, w *Writer, h *held, c comment[ID]) error {
	hash := digest(c.body)
	if *c.hash == hash {
		return nil
	}
	if err := h.hold(ctx); err != nil {
		return err
	}
	var none ID
	if *c.id == none {
		id, created, err := c.ensure(ctx)
		if err != nil {
			return err
		}
		*c.id = id
		if created {
			*c.hash, h.rec.EditedAt = hash, time.Now()
			return h.save(ctx)
		}
	}
	err := c.edit(ctx, *c.id)
	w.count(c.tracker, OpComment, err)
	if err != nil {
		return err
	}
	*c.hash, h.rec.EditedAt = hash, time.Now()
	return h.save(ctx)
}

// giteaComment creates or edits the job's comment on the pull request.
// Before a create it looks for the marker, in case an earlier create went
// through but its answer or its record was lost.
func (w *Writer) giteaComment(ctx context.Context, h *held, t targets, v View) error {
	body := GiteaBody(v)
	return writeComment(ctx, w, h, comment[int64]{
		tracker: TrackerGitea, body: body, id: &h.rec.GiteaComment, hash: &h.rec.GiteaHash,
		ensure: func(ctx context.Context) (int64, bool, error) {
			found, err := w.cfg.Gitea.FindComment(ctx, t.repo, t.pr, v.Status.Job.ID)
			if err != nil {
				w.count(TrackerGitea, OpComment, err)
				return 0, false, err
			}
			if found != 0 {
				return found, false, nil
			}
			id, err := w.cfg.Gitea.CreateComment(ctx, t.repo, t.pr, body)
			w.count(TrackerGitea, OpComment, err)
			return id, err == nil, err
		},
		edit: func(ctx context.Context, id int64) error {
			return w.cfg.Gitea.EditComment(ctx, t.repo, id, body)
		},
	})
}

// planeComment creates or edits the job's comment on the work item. Plane
// finds an earlier create itself: it refuses a second comment with the
// job's external id and names the first.
func (w *Writer) planeComment(ctx context.Context, h *held, t targets, v View) error {
	body := PlaneHTML(v)
	return writeComment(ctx, w, h, comment[string]{
		tracker: TrackerPlane, body: body, id: &h.rec.PlaneComment, hash: &h.rec.PlaneHash,
		ensure: func(ctx context.Context) (string, bool, error) {
			id, created, err := w.cfg.Plane.CreateComment(ctx, t.workspace, t.project, t.item, v.Status.Job.ID, body)
			w.count(TrackerPlane, OpComment, err)
			return id, created, err
		},
		edit: func(ctx context.Context, id string) error {
			return w.cfg.Plane.EditComment(ctx, t.workspace, t.project, t.item, id, body)
		},
	})
}
