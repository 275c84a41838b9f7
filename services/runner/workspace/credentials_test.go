package workspace_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/workspace"
)

// The clone's fetches from an origin that wants a login (git's smart
// HTTP behind Basic auth, as a private Gitea repository) take it from
// the workspace's credentials file, ORCH_GIT_CREDENTIALS_FILE, even at a
// path the shell would split and read-only; without the file they fail,
// as git with no login does, and never wait for a prompt.
func TestFetchWithTheCredentialsFile(t *testing.T) {
	// git with no configuration of the user's: no helper, no login.
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	t.Setenv("GIT_CONFIG_GLOBAL", filepath.Join(home, "gitconfig"))

	root := t.TempDir()
	seed := filepath.Join(t.TempDir(), "seed")
	if err := workspace.CreateRepo(context.Background(), seed, "main", map[string]string{"README.md": "private\n"}); err != nil {
		t.Fatal(err)
	}
	gitOut(t, root, "clone", "-q", "--bare", seed, filepath.Join(root, "repo.git"))
	backend := testkit.GitHTTPBackend(t, root)
	var refused atomic.Int32
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "orch-bot" || p != "t0ken" {
			refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="gitea"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	}))
	defer origin.Close()
	repo := workspace.Repo{Project: "widgets", CloneURL: origin.URL + "/repo.git", DefaultBranch: "main"}

	ws := &workspace.Workspace{Root: t.TempDir()}
	if _, err := ws.Prepare(context.Background(), repo, workspace.Want{Task: "t1"}); err == nil || refused.Load() == 0 {
		t.Fatalf("without a login: %v (%d refused); want the fetch refused", err, refused.Load())
	}

	dir := filepath.Join(t.TempDir(), "it's a dir")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "git credentials")
	login := strings.Replace(origin.URL, "http://", "http://orch-bot:t0ken@", 1)
	if err := os.WriteFile(creds, []byte("https://other:x@gitea.example.com\n"+login+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Read-only, as a mounted secret is: git's store helper cannot
	// write back the login it used, and the fetch does not mind.
	if err := os.Chmod(creds, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
	ws = &workspace.Workspace{Root: t.TempDir(), GitCredentials: creds}
	co := prepare(t, ws, repo, workspace.Want{Task: "t1"})
	if b, err := os.ReadFile(filepath.Join(co.Dir, "README.md")); err != nil || string(b) != "private\n" {
		t.Errorf("the worktree's README.md: %q, %v", b, err)
	}
}
