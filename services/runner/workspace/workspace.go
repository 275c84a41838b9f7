// Package workspace lays out a runner's disk with real git: per project a
// cached clone, per task a git worktree on its own branch, per job and
// attempt a log file.
//
//	repos/<project>.git/             bare clone of clone_url, fetched before each job
//	                                 (concurrent jobs of a project share fetches)
//	worktrees/<project>/<task>/      the task's worktree, on branch agent/<task>
//	                                 or its pull request's head branch
//	logs/<job>/<attempt>.log         the agent's output per attempt
//
// One runner process owns a workspace: Clean, called at start, removes the
// lock files a crashed git left behind, which is only safe when no other
// process works in the same directory.
package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/orch-dev/orch/proto"
)

// BranchPrefix starts the name of every task branch: agent/<task>.
const BranchPrefix = "agent/"

// Workspace is a runner's root directory. The zero value is not usable:
// set Root (an absolute path).
type Workspace struct {
	Root string
	// GitCredentials is a git-credential-store file
	// (ORCH_GIT_CREDENTIALS_FILE) that the clone's fetches take their
	// login from, besides the runner user's own git configuration; ""
	// for none.
	GitCredentials string

	mu    sync.Mutex
	repos map[string]*repoState
}

// repoState is what this process shares about one project's clone.
type repoState struct {
	// mu serialises git commands that write the clone (worktree add
	// and remove, branch delete, a fork's pull request's fetch, git's
	// maintenance): they would fail on each other's ref and config
	// locks. The shared fetch of origin runs outside it (fetchOrigin).
	mu sync.Mutex
	// fetches coalesces the fetches of concurrent jobs.
	fetches fetcher
	// url is the clone_url the clone was made or last set to by this
	// process: the clone is looked at again only when it changes.
	url string
	// spare is the clone's spare worktree (spare.go), nil for none.
	spare *spare
}

// Repo says where a project's code comes from.
type Repo struct {
	// Project is the registry key.
	Project string
	// CloneURL is a URL or a local path; a relative path is taken from the
	// runner's working directory.
	CloneURL string
	// DefaultBranch is where a new task branch starts.
	DefaultBranch string
	// Sparse lists the directories a new worktree checks out (git's cone
	// mode); empty checks out everything.
	Sparse []string
	// NoSpare keeps no spare worktree: MakeSpare removes the one there.
	NoSpare bool
}

// Branch is the branch of task.
func Branch(task string) string { return BranchPrefix + proto.Token(task) }

// repo returns the shared state of project's clone.
func (w *Workspace) repo(project string) *repoState {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.repos == nil {
		w.repos = map[string]*repoState{}
	}
	r, ok := w.repos[project]
	if !ok {
		r = &repoState{}
		w.repos[project] = r
	}
	return r
}

// inside joins elems under Root and checks the result stays there. Every
// element is also passed through proto.Token, so no id can name "..", a
// separator or an absolute path.
func (w *Workspace) inside(elems ...string) (string, error) {
	parts := []string{w.Root}
	for _, e := range elems {
		parts = append(parts, proto.Token(e))
	}
	p := filepath.Join(parts...)
	rel, err := filepath.Rel(w.Root, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", fmt.Errorf("path %q escapes the workspace %s", p, w.Root)
	}
	return p, nil
}

// RepoDir is the cached clone of project.
func (w *Workspace) RepoDir(project string) (string, error) {
	d, err := w.inside("repos", project)
	return d + ".git", err
}

// WorktreeDir is the worktree of task in project.
func (w *Workspace) WorktreeDir(project, task string) (string, error) {
	return w.inside("worktrees", project, task)
}

// LogPath is where attempt n of job id writes its output.
func (w *Workspace) LogPath(jobID string, attempt int) string {
	return filepath.Join(w.Root, "logs", proto.Token(jobID), strconv.Itoa(attempt)+".log")
}

// TaskFilePath is where TaskFile writes job jobID's task text in dir.
func TaskFilePath(dir, jobID string) string {
	return filepath.Join(dir, ".orch", "task-"+proto.Token(jobID)+".md")
}

// TaskFile writes the task text for the agent into dir and returns its
// path. It lives under .orch/, which the agent is told to leave alone and
// which is kept out of git by the worktree's info/exclude.
func (w *Workspace) TaskFile(dir, jobID, text string) (string, error) {
	path := TaskFilePath(dir, jobID)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("creating task file dir: %w", err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("writing task file: %w", err)
	}
	return path, nil
}

// ensureClone makes the bare clone at gitDir if it is missing. It is made
// aside and renamed into place, so a crash never leaves half a clone.
func (w *Workspace) ensureClone(ctx context.Context, gitDir, url string) error {
	url, err := cloneSource(url)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(gitDir, "HEAD")); err == nil {
		// Follow a clone_url changed in the registry.
		_, err := git(ctx, gitDir, "remote", "set-url", "origin", url)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(gitDir), 0o755); err != nil {
		return fmt.Errorf("creating repos dir: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(gitDir), ".tmp-clone-")
	if err != nil {
		return fmt.Errorf("creating clone dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, args := range [][]string{
		{"init", "--bare", "--quiet"},
		{"remote", "add", "origin", url},
		// Remote branches under refs/remotes/origin, so fetches never
		// touch the local agent/<task> branches.
		{"config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*"},
	} {
		if _, err := git(ctx, tmp, args...); err != nil {
			return fmt.Errorf("making clone: %w", err)
		}
	}
	// Every worktree reads the clone's info/exclude: keep the task files
	// out of the agent's commits.
	if err := os.MkdirAll(filepath.Join(tmp, "info"), 0o755); err != nil {
		return fmt.Errorf("making clone: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "info", "exclude"), []byte(".orch/\n"), 0o644); err != nil {
		return fmt.Errorf("making clone: %w", err)
	}
	if err := os.Rename(tmp, gitDir); err != nil {
		return fmt.Errorf("placing clone: %w", err)
	}
	return nil
}

// scpLike matches git's user@host:path form, which is not a local path.
var scpLike = regexp.MustCompile(`^[A-Za-z0-9_.@-]+:[^/]`)

// cloneSource returns url, with a local path made absolute (the clone's
// git commands run in another directory).
func cloneSource(url string) (string, error) {
	if url == "" {
		return "", errors.New("project has no clone_url")
	}
	if strings.Contains(url, "://") || scpLike.MatchString(url) || filepath.IsAbs(url) {
		return url, nil
	}
	abs, err := filepath.Abs(url)
	if err != nil {
		return "", fmt.Errorf("clone_url %q: %w", url, err)
	}
	return abs, nil
}

// Remove deletes the task's worktree and its local branch, agent/<task>
// or the pull request's head branch it is on (a pushed branch stays on the
// remote), and, for pull request pr (0 for none), the head of a fork's
// pull request fetched for it. Removing what is not there is not an
// error.
func (w *Workspace) Remove(ctx context.Context, project, task string, pr int) error {
	dir, err := w.WorktreeDir(project, task)
	if err != nil {
		return err
	}
	gitDir, err := w.RepoDir(project)
	if err != nil {
		return err
	}
	rs := w.repo(project)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, err := os.Stat(filepath.Join(gitDir, "HEAD")); err != nil {
		// No clone, so no worktree registered: just the directory.
		return removeAll(dir)
	}
	branches := []string{Branch(task)}
	if isWorktree(ctx, dir) {
		// The worktree may be on a pull request's head branch: its local
		// copy goes too.
		if b := currentBranch(ctx, dir); b != "" && b != branches[0] {
			branches = append(branches, b)
		}
		if _, err := git(ctx, gitDir, "worktree", "remove", "--force", "--force", dir); err != nil {
			return fmt.Errorf("removing worktree of %s: %w", task, err)
		}
	}
	if err := removeAll(dir); err != nil {
		return err
	}
	if _, err := git(ctx, gitDir, "worktree", "prune"); err != nil {
		return err
	}
	for _, branch := range branches {
		if !refExists(ctx, gitDir, "refs/heads/"+branch) {
			continue
		}
		if _, err := git(ctx, gitDir, "branch", "-D", "--quiet", "--", branch); err != nil {
			return fmt.Errorf("deleting branch %s: %w", branch, err)
		}
	}
	if pr > 0 && refExists(ctx, gitDir, pullRef(pr)) {
		if _, err := git(ctx, gitDir, "update-ref", "-d", pullRef(pr)); err != nil {
			return fmt.Errorf("deleting %s: %w", pullRef(pr), err)
		}
	}
	return nil
}

func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// Clean removes what a crashed run left behind: git's lock files in every
// clone (index.lock, HEAD.lock, refs/**/*.lock, ...), half-made clones,
// spare worktrees, and worktree records whose directory is gone. It returns the lock files it
// removed. Call it at start, before any job runs.
func (w *Workspace) Clean(ctx context.Context) ([]string, error) {
	// Spare worktrees are made again (spare.go); their records go with
	// the prune below.
	if err := os.RemoveAll(filepath.Join(w.Root, "spares")); err != nil {
		return nil, fmt.Errorf("removing spare worktrees: %w", err)
	}
	reposDir := filepath.Join(w.Root, "repos")
	entries, err := os.ReadDir(reposDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", reposDir, err)
	}
	var removed []string
	for _, e := range entries {
		path := filepath.Join(reposDir, e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-clone-") {
			if err := os.RemoveAll(path); err != nil {
				return removed, fmt.Errorf("removing half-made clone: %w", err)
			}
			continue
		}
		if !e.IsDir() {
			continue
		}
		err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "objects" {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(d.Name(), ".lock") {
				if err := os.Remove(p); err != nil {
					return err
				}
				removed = append(removed, p)
			}
			return nil
		})
		if err != nil {
			return removed, fmt.Errorf("removing stale git locks in %s: %w", path, err)
		}
		if _, err := git(ctx, path, "worktree", "prune"); err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// isWorktree reports whether dir is a usable git worktree.
func isWorktree(ctx context.Context, dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		return false
	}
	out, err := git(ctx, dir, "rev-parse", "--is-inside-work-tree")
	return err == nil && strings.TrimSpace(out) == "true"
}

// refExists reports whether ref exists in the git directory gitDir (or,
// when gitDir is a worktree, in its repository). A clone's refs are read
// in-process when they can be (see readRef).
func refExists(ctx context.Context, gitDir, ref string) bool {
	if _, err := os.Stat(filepath.Join(gitDir, "HEAD")); err == nil {
		if oid, err := readRef(gitDir, ref); err == nil {
			return oid != ""
		}
	}
	_, err := git(ctx, gitDir, "rev-parse", "--verify", "--quiet", ref)
	return err == nil
}

// fetchArgs are args of a git command that reaches origin: preceded,
// when the workspace has a credentials file, by a credential helper that
// reads it (after the user's own helpers, which git asks first).
func (w *Workspace) fetchArgs(args ...string) []string {
	if w.GitCredentials == "" {
		return args
	}
	// The helper string is run by the shell: the path is quoted.
	quoted := "'" + strings.ReplaceAll(w.GitCredentials, "'", `'\''`) + "'"
	return append([]string{"-c", "credential.helper=store --file=" + quoted}, args...)
}

// git runs git in dir and returns its standard output; its error carries
// the standard error.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	return gitInput(ctx, dir, "", args...)
}

// gitInput runs git in dir with stdin as its standard input.
func gitInput(ctx context.Context, dir, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	// Never wait for a password on a terminal nobody watches.
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=true", "GCM_INTERACTIVE=never")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// CreateRepo makes a git repository at dir with one commit of files on
// branch: the sample project of a local run, and the remote of tests.
func CreateRepo(ctx context.Context, dir, branch string, files map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", p, err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	id := []string{"-c", "user.name=orch", "-c", "user.email=orch@localhost", "-c", "commit.gpgsign=false"}
	for _, args := range [][]string{
		{"init", "--quiet", "--initial-branch=" + branch},
		{"add", "--all"},
		append(id, "commit", "--quiet", "--allow-empty", "-m", "initial commit"),
	} {
		if _, err := git(ctx, dir, args...); err != nil {
			return fmt.Errorf("creating repository %s: %w", dir, err)
		}
	}
	return nil
}
