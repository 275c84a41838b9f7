// Package project sets up what a runner needs to run jobs of the bench's
// one project: a real git repository to clone and the registry naming it.
package project

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/orch-dev/orch/kit/testkit"
)

// Key is the project key of every bench job.
const Key = testkit.ProjectKey

// Setup creates, under dir, a git repository with one commit on main
// (repo/) and a registry serving it (projects.yaml), and returns the
// registry's path.
func Setup(dir string) (string, error) {
	repo := filepath.Join(dir, "repo")
	if err := testkit.Repo(repo); err != nil {
		return "", err
	}
	return Registry(dir, repo)
}

// Registry writes, under dir, a registry (projects.yaml) serving the
// project from cloneURL, and returns its path.
func Registry(dir, cloneURL string) (string, error) {
	return testkit.Registry(dir, cloneURL, "    agent_user: orch-bot\n    trusted_actors: [alice]\n")
}

// Add appends to the registry at path a project key on the Gitea
// repository giteaRepo, served from the registry's first clone_url like
// the bench's project, with extra (YAML lines indented four spaces) in
// its entry.
func Add(path, key, giteaRepo, extra string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var clone string
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "clone_url: "); ok && clone == "" {
			clone = v
		}
	}
	if clone == "" {
		return fmt.Errorf("%s names no clone_url", path)
	}
	entry := fmt.Sprintf("  - key: %s\n    gitea_repo: %s\n    clone_url: %s\n    default_branch: main\n    agent_user: orch-bot\n    trusted_actors: [alice]\n%s",
		key, giteaRepo, clone, extra)
	return os.WriteFile(path, append(data, entry...), 0o644)
}
