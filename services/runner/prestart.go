package runner

import (
	"cmp"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// Sandboxes made ahead.
//
// A confined agent's start is mostly bwrap's: its namespaces and mounts
// take several milliseconds, more than the whole of the runner's work
// between a job's delivery and its agent's start (admission's writes,
// the worktree's checks, the task's state, the task text). None of that
// work changes what the sandbox is made of when the task's worktree
// exists already, nor when a new task will take the project's spare
// worktree (workspace's spare.go): the spare becomes the task's worktree
// by a rename, which keeps the directory, its .git file and the record
// it names what they are. bwrap resolves what it binds when it starts,
// though, and the rename may come before or after that: a sandbox made
// on the spare binds everything else at once and the worktree only when
// the runner says the spare is the task's (laterBind, sandbox.Job.Later),
// at the worktree's place.
//
// So the sandbox is made beside that work: as soon as the job is
// delivered, beside the reads of its record and holds, the agent's
// command is made as run would make it (for the attempt of the delivery,
// which is the job's unless its record says it was held before),
// confined, and started up to its gate (agent.Prestart). The agent
// itself starts only when run lets it: after the job's slot and task
// lock are held and its worktree is ready, and only when the command run
// makes then is the same, and the worktree, its .git file and the task's
// home are the directories and file the sandbox bound or will bind (not
// made again meanwhile). Otherwise, and on every way out of a job before
// run starts its agent (a cancel, a deferral, a lost lock), the sandbox
// is killed at its gate: nothing of the agent's ran.
//
// What the command depends on is read ahead too: what is left of the
// project's budget (its --max-budget-usd), and the session the task's
// last job here ended with (sessions), which its next one usually
// resumes. A new task that does not take the spare (it starts at
// another commit, or another task took the spare first) gets a worktree
// of its own, which is not what the sandbox was made for: that sandbox
// is ended, and one made for the worktree.

// prestart is a job's sandbox made ahead, once done is closed: none when
// st is nil.
type prestart struct {
	done  chan struct{}
	count *prometheus.CounterVec
	// base is the agent's spec before its confinement; bound are the
	// places of the directories and file the sandbox bound (the spare's
	// become the worktree's), and ids what they were.
	base  agent.Spec
	bound []string
	ids   []fileID
	// spec is base confined, stop ends its confinement, and st is its
	// agent waiting at the gate, until taken.
	spec agent.Spec
	stop func()
	st   *agent.Started
	// cap is what was left of the budget for the command (jobCap).
	cap float64
	// later, for a sandbox made on the spare, holds its worktree's
	// binding until the worktree is the task's.
	later *laterBind
	taken bool
}

// prestart makes job's sandbox ahead when job runs confined in its
// task's worktree, which exists or the project's spare may become, and
// no other job delivered here waits for its admission (then this one
// likely waits or is put back, and a sandbox made for it would be ended
// unused); nil otherwise. abort must be called.
func (r *Runner) prestart(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project, attempt int) *prestart {
	if r.conf.bwrap == "" || !job.Kind.RunsAgent() || r.admitting() {
		return nil
	}
	dir, err := r.ws.WorktreeDir(job.Project, job.Task.ID)
	if err != nil {
		return nil
	}
	// A new task's sandbox is made on the project's spare, which the
	// task's checkout renames into the worktree's place when the task
	// starts at the spare's commit: bwrap binds the worktree once that
	// is done (laterBind), wherever the spare was when bwrap started.
	src, spare := dir, false
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if src, spare = r.ws.Spare(job.Project); !spare {
			return nil
		}
	}
	seen, err := seeWorktree(src)
	if err != nil {
		return nil // a worktree half made, or a spare just taken
	}
	var later *laterBind
	if spare {
		if later, err = newLaterBind(seen.text); err != nil {
			return nil
		}
	}
	ps := &prestart{done: make(chan struct{}), count: r.metrics.ahead, cap: -1, later: later}
	go func() {
		defer close(ps.done)
		defer later.sent()
		session, _ := r.sessions.Load(lockKey(job))
		s, _ := session.(string)
		budget := r.jobCap(ctx, job, p)
		base := r.agentSpec(job, p, attempt, dir, workspace.TaskFilePath(dir, job.ID), r.ws.LogPath(job.ID, attempt), s, budget)
		spec := base
		stop, listen, err := r.confine(log, job, p, dir, later, &spec)
		if err != nil {
			later.bind()
			log.Debug("making the sandbox ahead", zap.Error(err))
			return
		}
		home := envValue(spec.Env, "HOME")
		bound := []string{dir, filepath.Join(dir, ".git"), home}
		ids := []fileID{seen.dir, seen.dotGit, identify([]string{home})[0]}
		st, err := r.agents.Prestart(spec)
		if err == nil {
			// The egress proxy's socket once the sandbox is ordered: the
			// agent reaches it only after its gate.
			if err = listen(); err != nil {
				st.Abort()
			}
		}
		if err != nil {
			stop()
			later.bind()
			log.Debug("making the sandbox ahead", zap.Error(err))
			return
		}
		ps.base, ps.bound, ps.ids, ps.spec, ps.stop, ps.st, ps.cap = base, bound, ids, spec, stop, st, budget
	}()
	return ps
}

// budget is the budget's cap read for the sandbox made ahead, or -1.
func (ps *prestart) budget() float64 {
	if ps == nil {
		return -1
	}
	<-ps.done
	return ps.cap
}

// take returns the sandbox made ahead for base, the agent's spec as run
// makes it now, confined and its agent in Started, with what ends its
// confinement; ok is false when there is none or it was made for another
// command or other directories (then it is ended, and base is returned).
// It is taken once.
func (ps *prestart) take(log *zap.Logger, base agent.Spec) (spec agent.Spec, stop func(), ok bool) {
	if ps == nil {
		return base, nil, false
	}
	<-ps.done
	if ps.st == nil || ps.taken {
		return base, nil, false
	}
	if !sameCommand(ps.base, base) || !slices.Equal(ps.ids, identify(ps.bound)) {
		log.Debug("the sandbox made ahead is not this command's: making another")
		ps.abort()
		return base, nil, false
	}
	ps.taken = true
	ps.later.bind()
	ps.count.WithLabelValues("used").Inc()
	spec = ps.spec
	spec.Started = ps.st
	return spec, ps.stop, true
}

// abort ends the sandbox made ahead unless it was taken.
func (ps *prestart) abort() {
	if ps == nil {
		return
	}
	<-ps.done
	if ps.st != nil && !ps.taken {
		ps.taken = true
		ps.st.Abort()
		ps.later.bind()
		ps.stop()
		ps.count.WithLabelValues("ended").Inc()
	}
}

// sameCommand reports whether a and b run the same agent command in the
// same place.
func sameCommand(a, b agent.Spec) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Dir == b.Dir &&
		a.LogPath == b.LogPath && a.Timeout == b.Timeout && a.KillGrace == b.KillGrace
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// identify is what each of paths is now; zeros for a missing one.
func identify(paths []string) []fileID {
	ids := make([]fileID, len(paths))
	for i, p := range paths {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			ids[i] = fileID{uint64(st.Dev), st.Ino}
		}
	}
	return ids
}

// worktreeSeen is a worktree's directory and .git file, as a sandbox
// made ahead bound them, and the file's text.
type worktreeSeen struct {
	dir, dotGit fileID
	text        string
}

// seeWorktree reads the worktree at dir. Its .git file is the one in the
// directory read, wherever a rename moves that meanwhile.
func seeWorktree(dir string) (seen worktreeSeen, err error) {
	d, err := os.Open(dir)
	if err != nil {
		return seen, err
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), ".git", unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return seen, err
	}
	g := os.NewFile(uintptr(fd), filepath.Join(dir, ".git"))
	defer g.Close()
	text, err := io.ReadAll(io.LimitReader(g, 4096))
	if err != nil {
		return seen, err
	}
	return worktreeSeen{dir: fileIDOf(d), dotGit: fileIDOf(g), text: string(text)}, nil
}

// fileIDOf is what f is; zeros when it cannot be said.
func fileIDOf(f *os.File) fileID {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return fileID{}
	}
	return fileID{uint64(st.Dev), st.Ino}
}

// laterBind holds back the binding of a sandbox's worktree (the
// sandbox's Later): bwrap binds it once the pipe's write end w is closed
// (bind), by then the worktree's, which was the project's spare when
// bwrap started; r is the read end, given to the sandbox's command.
type laterBind struct {
	r, w   *os.File
	dotGit string
}

func newLaterBind(dotGit string) (*laterBind, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &laterBind{r: r, w: w, dotGit: dotGit}, nil
}

// sent closes the runner's read end, once the supervisor has its own.
func (l *laterBind) sent() {
	if l != nil {
		_ = l.r.Close()
	}
}

// bind lets bwrap bind the worktree.
func (l *laterBind) bind() {
	if l != nil {
		_ = l.w.Close()
	}
}

// agentSpec is the spec of job's agent as run starts it in dir, unconfined:
// its command (resuming session, "" for a fresh one; with budget as
// Claude Code's own limit), environment, log and watchdog.
func (r *Runner) agentSpec(job *proto.Job, p *registry.Project, attempt int, dir, taskFile, logPath, session string, budget float64) agent.Spec {
	argv, agentEnv := r.agentCommand(p, job.Kind)
	argv, agentEnv = withSession(argv, agentEnv, session)
	if agent.IsClaude(argv) {
		argv = agent.WithSpendLimits(argv, budget, p.MaxTurns)
	}
	return agent.Spec{
		Argv: argv, Dir: dir, LogPath: logPath,
		Timeout:   cmp.Or(p.AgentTimeout, r.cfg.AgentTimeout),
		KillGrace: r.cfg.KillGrace,
		Env: agent.Env(r.envAllow,
			append(agentEnv, "ORCH_JOB_ID="+job.ID, "ORCH_ATTEMPT="+strconv.Itoa(attempt), "ORCH_KIND="+string(job.Kind),
				"ORCH_PROJECT="+job.Project, "ORCH_TASK="+job.Task.ID, "ORCH_TASK_FILE="+taskFile)...),
		Notes: &agent.Notes{},
	}
}
