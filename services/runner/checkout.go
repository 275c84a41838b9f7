package runner

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/prompt"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// clockSkew is how far the gateway's clock, which dates a job, may be
// behind the runner's: a fetch counts as later than a job's event only
// when it started this much after the job's creation time.
const clockSkew = time.Second

// prepare brings the job's worktree to the head the job is about (see
// workspace.Prepare) and logs where it is, with a warning when it holds
// an earlier job's work that was kept instead. A first attempt is about
// the remote as it was when the job was made, so a fetch that began since
// is enough; a retry fetches anew.
func (r *Runner) prepare(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, attempt int) (workspace.Checkout, error) {
	repo := repoOf(p)
	want := workspace.Want{Task: job.Task.ID, HeadBranch: job.Task.Branch, HeadSHA: job.Task.HeadSHA, PR: job.Task.PR, Fork: job.Task.FromFork}
	if attempt == 1 && !job.CreatedAt.IsZero() {
		want.Since = job.CreatedAt.Add(clockSkew)
	}
	co, err := r.ws.Prepare(ctx, repo, want)
	if err != nil {
		return co, err
	}
	fields := []zap.Field{zap.String("branch", co.Branch), zap.String("head", co.Head), zap.String("target", co.Target)}
	if co.Made != "" {
		fields = append(fields, zap.String("made", co.Made))
	}
	if len(co.Notes) > 0 {
		log.Warn("worktree prepared with notes for the agent", append(fields, zap.Int("unpushed", co.Unpushed),
			zap.Int("uncommitted", len(co.Uncommitted)), zap.Strings("notes", co.Notes))...)
	} else {
		log.Info("worktree prepared", fields...)
	}
	return co, nil
}

// repoOf is where p's code comes from.
func repoOf(p *registry.Project) workspace.Repo {
	return workspace.Repo{Project: p.Key, CloneURL: p.CloneURL, DefaultBranch: p.DefaultBranch, Sparse: p.SparseCheckout,
		NoSpare: p.SpareWorktree != nil && !*p.SpareWorktree}
}

// makeSpare makes p's spare worktree ready for its next new task (see
// workspace.MakeSpare). It is only a head start: a failure is logged, and
// the next new task adds its worktree itself.
func (r *Runner) makeSpare(ctx context.Context, p *registry.Project) {
	made, err := r.ws.MakeSpare(ctx, repoOf(p))
	if err != nil {
		r.log.Warn("making the spare worktree", zap.String("project", p.Key), zap.Error(err))
	}
	if made {
		r.metrics.spares.WithLabelValues(p.Key).Inc()
	}
}

// promptData is what the task template of job sees, prepared in co.
func promptData(job *proto.Job, attempt, maxAttempts int, co workspace.Checkout) prompt.Data {
	return prompt.Data{Job: job, Attempt: attempt, Max: maxAttempts, Branch: co.Branch, Dir: co.Dir,
		Head: co.Head, Upstream: co.Upstream, Notes: co.Notes}
}
