package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/taskstate"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// carried is what an attempt carries over from the task's earlier work,
// on whichever runner that was (package taskstate), and what it saves for
// the next one.
type carried struct {
	place taskstate.Place
	// defaultBranch is the project's: a worktree at its remote head
	// holds no commit of its own.
	defaultBranch string
	// resume is the agent session the attempt resumes; "" starts a fresh
	// one. resumed is the session it did resume, once it ran.
	resume, resumed string
	// restored is what the record says was restored, or that the saved
	// state could not be read.
	restored string
}

// stateMetrics count the task states this runner saved and restored.
type stateMetrics struct {
	saves    *prometheus.CounterVec
	restores *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	resumes  *prometheus.CounterVec
}

func newStateMetrics(reg *prometheus.Registry) *stateMetrics {
	m := &stateMetrics{
		saves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orch_runner_task_state_saves_total",
			Help: "Task states saved into the object store task_state, by when (periodic, while the agent runs; end, of an attempt) and result (ok; unchanged, nothing put as nothing changed since the last save; empty, nothing to carry, so no state kept; failed)."}, []string{"when", "result"}),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orch_runner_task_state_restores_total",
			Help: "Task states read before an attempt, by result: restored (written into the worktree), current (the worktree already had it), kept (the worktree has work of its own), unreadable (corrupt or missing objects: the job ran from the remote head), failed (the store did not answer)."}, []string{"result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orch_runner_task_state_bytes_total",
			Help: "Bytes of task states saved and restored, by op (save, restore)."}, []string{"op"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orch_runner_agent_resumes_total",
			Help: "Attempts that resumed the agent's last session, by result: resumed, refused (the agent did not know the session: a fresh one was started)."}, []string{"result"}),
	}
	reg.MustRegister(m.saves, m.restores, m.bytes, m.resumes)
	for _, when := range []string{"periodic", "end"} {
		for _, res := range []string{"ok", "unchanged", "empty", "failed"} {
			m.saves.WithLabelValues(when, res)
		}
	}
	for _, res := range []string{"restored", "current", "kept", "unreadable", "failed"} {
		m.restores.WithLabelValues(res)
	}
	m.bytes.WithLabelValues("save")
	m.bytes.WithLabelValues("restore")
	m.resumes.WithLabelValues("resumed")
	m.resumes.WithLabelValues("refused")
	return m
}

// claudeDir is Claude Code's configuration directory for job's agent:
// under the task's own HOME when the agent is confined, else the runner's
// CLAUDE_CONFIG_DIR or $HOME/.claude, where an unconfined Claude Code
// keeps its sessions.
func (r *Runner) claudeDir(job *proto.Job) (string, error) {
	if r.conf.bwrap != "" {
		home, err := r.homeDir(job)
		if err != nil {
			return "", err
		}
		return filepath.Join(home, ".claude"), nil
	}
	if d := os.Getenv("CLAUDE_CONFIG_DIR"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the runner's home for the agent's sessions: %w", err)
	}
	return filepath.Join(home, ".claude"), nil
}

// carryIn restores the task's saved state into the worktree co when it
// lacks it, and decides the session to resume. What the agent should know
// goes into co's notes: what was restored and from which runner, changes
// left out for the size bound, a state that could not be read (then the
// worktree is as prepared, at the remote head), and a resumed session.
// Nothing here fails the job. found is the state's lookup (Store.Lookup),
// made while the worktree was checked.
func (r *Runner) carryIn(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, attempt int, co *workspace.Checkout, found taskstate.Found) carried {
	c := carried{place: taskstate.Place{Project: job.Project, Task: job.Task.ID, Worktree: co.Dir, Head: co.Head}, defaultBranch: p.DefaultBranch}
	if r.state == nil {
		return c
	}
	dir, err := r.claudeDir(job)
	if err != nil {
		log.Warn("task state: no agent session directory", zap.Error(err))
	}
	c.place.ClaudeDir = dir
	res, err := r.state.RestoreFound(ctx, c.place, found)
	m := res.Manifest
	switch {
	case errors.Is(err, taskstate.ErrUnreadable):
		r.stateMetrics.restores.WithLabelValues("unreadable").Inc()
		log.Warn("task state: the saved state cannot be read; the job runs from the remote head", zap.Error(err))
		c.restored = "the saved state could not be read: " + err.Error()
		co.Notes = append(co.Notes, "The task's saved state from an earlier attempt could not be read ("+err.Error()+
			"), so this worktree starts from the remote head: work of earlier attempts that was not pushed is not here.")
		return c
	case err != nil:
		r.stateMetrics.restores.WithLabelValues("failed").Inc()
		log.Warn("task state: reading the saved state failed; the job runs on the worktree as it is", zap.Error(err))
		return c
	case m == nil:
		return c
	}
	if res.Fetched {
		r.stateMetrics.bytes.WithLabelValues("restore").Add(float64(m.Bytes))
	}
	fields := []zap.Field{zap.String("saved_by", m.Runner), zap.Time("saved_at", m.SavedAt), zap.String("saved_head", m.Head), zap.Int64("bytes", m.Bytes)}
	own := res.Skipped != "" && m.Runner == r.cfg.Name
	switch {
	case res.Did:
		r.stateMetrics.restores.WithLabelValues("restored").Inc()
		c.restored = fmt.Sprintf("%s from runner %s (saved %s at %s)", res.What(), m.Runner, m.SavedAt.Format(time.RFC3339), short(m.Head))
		log.Info("task state restored", append(fields, zap.String("restored", res.What()))...)
		co.Notes = append(co.Notes, fmt.Sprintf("This worktree was restored from the task's state that runner %s saved at %s: %s. It is at commit `%s`.",
			m.Runner, m.SavedAt.Format(time.RFC3339), res.What(), short(m.Head)))
		if head, err := headOf(ctx, co.Dir); err == nil {
			co.Head = head
		}
	case own:
		r.stateMetrics.restores.WithLabelValues("current").Inc()
		log.Debug("task state: the worktree is the saved one", fields...)
	default:
		r.stateMetrics.restores.WithLabelValues("kept").Inc()
		log.Warn("task state: not restored", append(fields, zap.String("why", res.Skipped))...)
		co.Notes = append(co.Notes, fmt.Sprintf("The task's state saved by runner %s was not restored: %s.", m.Runner, res.Skipped))
	}
	if m.Omitted != "" && (res.Did || own) {
		co.Notes = append(co.Notes, "The last attempt's uncommitted changes and untracked files were not saved ("+m.Omitted+"); its commits are here.")
	}
	if p.Resumes() && m.SessionID != "" && (res.Did && m.Session || own) {
		// Claude Code refuses a session whose transcript it does not
		// have: start a fresh one rather than run it twice.
		if transcript := filepath.Join(taskstate.SessionDir(c.place.ClaudeDir, co.Dir), m.SessionID+".jsonl"); agent.IsClaude(r.commandOf(p)) && !exists(transcript) {
			log.Info("task state: the session's transcript is not here: a fresh session", zap.String("session", m.SessionID))
			return c
		}
		c.resume = m.SessionID
		since := "Since then a new event came: see what triggered this job."
		if attempt > 1 {
			since = "Your previous attempt was interrupted: continue."
		}
		co.Notes = append(co.Notes, "You are resuming your earlier session of this task. "+since)
	}
	return c
}

// withSession adds the session to resume to the agent's argv and
// environment: Claude Code's --resume, and ORCH_SESSION_ID for any agent.
func withSession(argv, env []string, session string) ([]string, []string) {
	if session == "" {
		return argv, env
	}
	if agent.IsClaude(argv) {
		argv = append(append([]string(nil), argv...), "--resume", session)
	}
	return argv, append(env, "ORCH_SESSION_ID="+session)
}

// runCarried runs the agent through start (the attempt's spec, confined,
// resuming session or starting fresh for "") while saving the task's
// state every TaskStateInterval, then saves it once more, whatever the
// outcome. A resume the agent refuses (it does not know the session)
// is run again, within the attempt, in a fresh session.
func (r *Runner) runCarried(ctx context.Context, log *zap.Logger, job *proto.Job, c *carried,
	start func(session string) (agent.Result, []string, string, error)) (agent.Result, []string, error) {
	var (
		stop = make(chan struct{})
		bg   sync.WaitGroup
	)
	if r.state != nil && r.cfg.TaskStateInterval > 0 {
		bg.Go(func() {
			t := time.NewTicker(r.cfg.TaskStateInterval)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					r.saveState(ctx, log, c, "", "periodic")
				}
			}
		})
	}
	res, argv, logPath, err := start(c.resume)
	if err == nil && res.Err != nil && c.resume != "" && agent.ResumeRefused(logPath) {
		r.stateMetrics.resumes.WithLabelValues("refused").Inc()
		log.Warn("the agent does not know the session to resume: running it again in a fresh session", zap.String("session", c.resume))
		c.resume = ""
		res, argv, _, err = start("")
	} else if err == nil && c.resume != "" {
		r.stateMetrics.resumes.WithLabelValues("resumed").Inc()
		c.resumed = c.resume
		log.Info("the agent resumed its session", zap.String("session", c.resume))
	}
	close(stop)
	bg.Wait()
	return res, argv, err
}

// saveState saves the task's state; when says why (periodic, end). A
// failed save is logged and counted, never the job's failure.
func (r *Runner) saveState(ctx context.Context, log *zap.Logger, c *carried, session, when string) {
	if r.state == nil || c.place.Worktree == "" {
		return
	}
	// The end's save runs whatever stopped the job, within AckWait.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
	defer cancel()
	pl := c.place
	if head, branch, ok := r.ws.Pristine(pl.Project, pl.Worktree, c.defaultBranch); ok {
		pl.Pristine = &taskstate.Pristine{Head: head, Branch: branch}
	}
	m, err := r.state.Save(ctx, pl, session)
	if err != nil {
		r.stateMetrics.saves.WithLabelValues(when, "failed").Inc()
		log.Warn("task state: saving failed", zap.String("when", when), zap.Error(err))
		return
	}
	if m.Empty {
		r.stateMetrics.saves.WithLabelValues(when, "empty").Inc()
		log.Debug("task state: nothing to carry, no state kept", zap.String("when", when))
		return
	}
	if m.Unchanged {
		r.stateMetrics.saves.WithLabelValues(when, "unchanged").Inc()
		log.Debug("task state unchanged since its last save", zap.String("when", when))
		return
	}
	r.stateMetrics.saves.WithLabelValues(when, "ok").Inc()
	r.stateMetrics.bytes.WithLabelValues("save").Add(float64(m.Bytes))
	fields := []zap.Field{zap.String("when", when), zap.String("head", m.Head), zap.Int("commits", m.Commits),
		zap.Bool("changes", m.Changes), zap.Int("untracked", m.Untracked), zap.String("session", m.SessionID), zap.Int64("bytes", m.Bytes)}
	if m.Omitted != "" {
		log.Warn("task state saved without the uncommitted changes", append(fields, zap.String("omitted", m.Omitted))...)
		return
	}
	log.Debug("task state saved", fields...)
}

// dropState deletes the task's state (a cleanup).
func (r *Runner) dropState(ctx context.Context, log *zap.Logger, job *proto.Job) {
	if r.state == nil {
		return
	}
	if err := r.state.Delete(ctx, job.Project, job.Task.ID); err != nil {
		log.Warn("task state: deleting failed", zap.Error(err))
	}
}

func headOf(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "HEAD").Output()
	return strings.TrimSpace(string(out)), err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
