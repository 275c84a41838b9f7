// Package workspace lays out a runner's disk: per task a working
// directory, per job and attempt a log file.
package workspace

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/orch-dev/orch/proto"
)

// Workspace is a runner's root directory:
//
//	worktrees/<project>/<task>/   where the agent works
//	logs/<job>/<attempt>.log      the agent's output per attempt
type Workspace struct {
	Root string
}

// TaskDir returns the task's working directory, created if missing. Every
// path element is passed through proto.Token, so no task id can reach
// outside Root.
func (w *Workspace) TaskDir(project, task string) (string, error) {
	dir := filepath.Join(w.Root, "worktrees", proto.Token(project), proto.Token(task))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating task dir: %w", err)
	}
	return dir, nil
}

// LogPath is where attempt n of job id writes its output.
func (w *Workspace) LogPath(jobID string, attempt int) string {
	return filepath.Join(w.Root, "logs", proto.Token(jobID), strconv.Itoa(attempt)+".log")
}

// TaskFile writes the task text for the agent into dir and returns its
// path. It lives under .orch/, which the agent is told to leave alone.
func (w *Workspace) TaskFile(dir, jobID, text string) (string, error) {
	path := filepath.Join(dir, ".orch", "task-"+proto.Token(jobID)+".md")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("creating task file dir: %w", err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("writing task file: %w", err)
	}
	return path, nil
}
