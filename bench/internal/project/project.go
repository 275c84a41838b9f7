// Package project sets up what a runner needs to run jobs of the bench's
// one project: a real git repository to clone and the registry naming it.
package project

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Key is the project key of every bench job.
const Key = "widgets"

// Setup creates, under dir, a git repository with one commit on main
// (repo/) and a registry serving it (projects.yaml), and returns the
// registry's path.
func Setup(dir string) (string, error) {
	repo := filepath.Join(dir, "repo")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(repo, "README.md"), []byte("# widgets\n"), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "README.md"},
		{"-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "initial"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	reg := filepath.Join(dir, "projects.yaml")
	yaml := fmt.Sprintf(`projects:
  - key: %s
    gitea_repo: acme/widgets
    clone_url: %s
    default_branch: main
    agent_user: orch-bot
    trusted_actors: [alice]
`, Key, repo)
	if err := os.WriteFile(reg, []byte(yaml), 0o644); err != nil {
		return "", err
	}
	return reg, nil
}
