package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ProjectKey is the key of the fixture project, served from the Gitea
// repository acme/widgets.
const ProjectKey = "widgets"

// Repo creates a git repository at dir with one commit on main holding
// README.md, for a project's clone_url. It returns an error rather than
// failing a test, so that the bench can use it too.
func Repo(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# widgets\n"), 0o644); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "README.md"},
		{"-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "initial"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// Registry writes dir/projects.yaml serving the repository at remote as
// project ProjectKey, with extra (YAML lines indented four spaces) added
// to its entry, and returns the file's path.
func Registry(dir, remote, extra string) (string, error) {
	path := filepath.Join(dir, "projects.yaml")
	yaml := RegistryYAML("clone_url: "+remote, "default_branch: main") + extra
	return path, os.WriteFile(path, []byte(yaml), 0o644)
}

// Project makes, under dir, a git repository (remote/) and a registry
// (projects.yaml) serving it as project ProjectKey, with extra added to
// the entry as in Registry. It returns the registry's path and the
// repository's.
func Project(t testing.TB, dir, extra string) (registry, remote string) {
	t.Helper()
	remote = filepath.Join(dir, "remote")
	if err := Repo(remote); err != nil {
		t.Fatal(err)
	}
	registry, err := Registry(dir, remote, extra)
	if err != nil {
		t.Fatal(err)
	}
	return registry, remote
}

// AgentScript writes an agent: the shell script body at dir/name, and
// returns the command that runs it ("sh <path>").
func AgentScript(t testing.TB, dir, name, body string) string {
	t.Helper()
	return "sh " + Script(t, filepath.Join(dir, name), body)
}

// Script writes the shell script body, executable, at path (a stand-in
// for a program such as claude), making its directory, and returns path.
func Script(t testing.TB, path, body string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
