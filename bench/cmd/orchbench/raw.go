package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/services/runner/sandbox"
)

// rawGit does by hand the least a runner must do to start an agent for a
// job: `git worktree add` of a new branch from a bare clone of the
// project (for a new task), and a start of the same agent binary in the
// worktree, waited for. It is the baseline of dispatch and of drain.
type rawGit struct {
	gitDir  string // bare clone of the project
	wtRoot  string // worktrees are made under it
	agent   string // the bench agent binary
	records string // where the agent appends its start lines
	// bwrap, when set, confines each spawn in bwrap's floor
	// (sandbox.Floor): the least any sandbox made per job costs.
	bwrap string
	// mu serialises worktree adds: git's `worktree add` reads the other
	// worktrees' records and fails on one being made at the same time
	// ("failed to read worktrees/<name>/commondir"), so a runner must
	// serialise them too.
	mu sync.Mutex
}

// newRawGit clones repo bare under dir.
func newRawGit(ctx context.Context, dir, repo, agent string) (*rawGit, error) {
	r := &rawGit{
		gitDir:  filepath.Join(dir, "raw.git"),
		wtRoot:  filepath.Join(dir, "raw-worktrees"),
		agent:   agent,
		records: filepath.Join(dir, "raw-starts.log"),
	}
	if err := os.MkdirAll(r.wtRoot, 0o755); err != nil {
		return nil, err
	}
	// A confined spawn binds the record file, which must exist.
	if f, err := os.OpenFile(r.records, os.O_CREATE|os.O_WRONLY, 0o644); err != nil {
		return nil, err
	} else if err := f.Close(); err != nil {
		return nil, err
	}
	if _, err := gitRun(ctx, dir, "clone", "--bare", "--quiet", repo, r.gitDir); err != nil {
		return nil, err
	}
	return r, nil
}

// worktree is where task's worktree goes.
func (r *rawGit) worktree(task string) string { return filepath.Join(r.wtRoot, task) }

// addWorktree adds task's worktree on a new branch agent/<task> from main.
func (r *rawGit) addWorktree(ctx context.Context, task string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := gitRun(ctx, r.gitDir, "worktree", "add", "--quiet", "--no-track", "-b", "agent/"+task, r.worktree(task), "main")
	return err
}

// spawn runs the agent for job id in task's worktree and waits for it.
func (r *rawGit) spawn(ctx context.Context, task, id string) error {
	argv := []string{r.agent, r.records}
	if r.bwrap != "" {
		argv = sandbox.Floor(r.bwrap, r.worktree(task), []string{r.records}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = r.worktree(task)
	cmd.Env = append(os.Environ(), "ORCH_JOB_ID="+id, "ORCH_ATTEMPT=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("agent: %w: %s", err, out)
	}
	return nil
}

// dispatch times, for each of n jobs one after the other, the start of
// the work (worktree add when newTask, then the agent's start) to the
// agent's own start stamp. Tasks are named prefix-<i>.
func (r *rawGit) dispatch(ctx context.Context, prefix string, n int, newTask bool) ([]time.Duration, error) {
	began := make([]time.Time, n)
	for i := range n {
		task := fmt.Sprintf("%s-%d", prefix, i)
		id := fmt.Sprintf("raw-%s-%d-%t-%t", prefix, i, newTask, r.bwrap != "")
		began[i] = time.Now()
		if newTask {
			if err := r.addWorktree(ctx, task); err != nil {
				return nil, err
			}
		}
		if err := r.spawn(ctx, task, id); err != nil {
			return nil, err
		}
	}
	starts, err := readStarts(r.records)
	if err != nil {
		return nil, err
	}
	lat := make([]time.Duration, n)
	for i := range n {
		id := fmt.Sprintf("raw-%s-%d-%t-%t", prefix, i, newTask, r.bwrap != "")
		t, ok := starts[id]
		if !ok {
			return nil, fmt.Errorf("raw agent %s left no start line", id)
		}
		lat[i] = t.Sub(began[i])
	}
	return lat, nil
}

// gitRun runs git in dir and returns its output.
func gitRun(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
