// Package project sets up what a runner needs to run jobs of the bench's
// one project: a real git repository to clone and the registry naming it.
package project

import (
	"path/filepath"

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
