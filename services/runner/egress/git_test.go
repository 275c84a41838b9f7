package egress_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/egress"
)

// gitOrigin is a git smart-HTTP server (git http-backend behind
// net/http/cgi) that wants Basic auth user:token on every request, as a
// Gitea with a private repository does.
type gitOrigin struct {
	*httptest.Server
	root  string
	mu    sync.Mutex
	auth  []string // the Authorization of each request
	paths []string // and its path
}

const gitUser, gitToken = "orch-bot", "tok3n-s3cret"

func newGitOrigin(t *testing.T) *gitOrigin {
	t.Helper()
	o := &gitOrigin{root: t.TempDir()}
	bare := filepath.Join(o.root, "repo.git")
	runGit(t, "", nil, "init", "-q", "--bare", "-b", "main", bare)
	runGit(t, bare, nil, "config", "http.receivepack", "true")
	seed := t.TempDir()
	runGit(t, "", nil, "clone", "-q", bare, seed)
	os.WriteFile(filepath.Join(seed, "README.md"), []byte("# repo\n"), 0o644)
	runGit(t, seed, nil, "add", "README.md")
	runGit(t, seed, nil, "commit", "-q", "-m", "first")
	runGit(t, seed, nil, "push", "-q", "origin", "main")

	backend := testkit.GitHTTPBackend(t, o.root)
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.auth = append(o.auth, r.Header.Get("Authorization"))
		o.paths = append(o.paths, r.URL.Path)
		o.mu.Unlock()
		if u, p, ok := r.BasicAuth(); !ok || u != gitUser || p != gitToken {
			w.Header().Set("WWW-Authenticate", `Basic realm="gitea"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(o.Close)
	return o
}

// gitEnv is an environment for git holding no credential: its own HOME,
// no system or global config, no prompt.
func gitEnv(t *testing.T) []string {
	home := t.TempDir()
	return []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + filepath.Join(home, "gitconfig"),
		"GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=true",
		"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.com",
		"GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.com",
	}
}

func runGit(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	out, err := gitCmd(dir, env, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func gitCmd(dir string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = env
	}
	return cmd
}

// TestGitClonesAndPushesWithTheRunnersCredential runs real git with only
// AgentEnv's environment: it clones and pushes to an origin that wants a
// token, which the proxy adds from the credentials file.
func TestGitClonesAndPushesWithTheRunnersCredential(t *testing.T) {
	origin := newGitOrigin(t)
	creds := filepath.Join(t.TempDir(), "git-credentials")
	os.WriteFile(creds, []byte("https://other:x@gitea.example.com\n"+
		strings.Replace(origin.URL, "http://", "http://"+gitUser+":"+gitToken+"@", 1)+"\n"), 0o600)
	f := setup(t, egress.Options{GitHosts: []string{origin.URL}, GitCredentials: creds})
	env := gitEnv(t)
	remote := origin.URL + "/repo.git"

	// Without the proxy the client has no credential and fails.
	if out, err := gitCmd("", env, "clone", "-q", remote, filepath.Join(t.TempDir(), "c")).CombinedOutput(); err == nil {
		t.Fatalf("clone without the proxy succeeded:\n%s", out)
	}
	agentEnv := append(slices.Clone(env), f.proxy.AgentEnv(f.base)...)
	for _, kv := range agentEnv {
		if strings.Contains(kv, gitToken) {
			t.Fatalf("the agent's environment holds the token: %s", kv)
		}
	}
	work := filepath.Join(t.TempDir(), "work")
	runGit(t, "", agentEnv, "clone", "-q", remote, work)
	if got := runGit(t, work, agentEnv, "config", "remote.origin.url"); strings.TrimSpace(got) != remote {
		t.Fatalf("origin %q: the rewrite must not show in the clone's config", got)
	}
	os.WriteFile(filepath.Join(work, "AGENT.md"), []byte("agent was here\n"), 0o644)
	runGit(t, work, agentEnv, "add", "AGENT.md")
	runGit(t, work, agentEnv, "commit", "-q", "-m", "agent commit")
	runGit(t, work, agentEnv, "push", "-q", "origin", "HEAD:main")

	head := strings.TrimSpace(runGit(t, work, agentEnv, "rev-parse", "HEAD"))
	if got := strings.TrimSpace(runGit(t, filepath.Join(origin.root, "repo.git"), nil, "rev-parse", "main")); got != head {
		t.Fatalf("origin main %s, want the pushed %s", got, head)
	}
	for _, l := range f.log() {
		if strings.Contains(l, gitToken) {
			t.Fatalf("the token is in the job log: %q", l)
		}
	}
}

// TestGitCredentialsAsGitWritesThem reads a credentials file that git
// itself wrote (`git credential-store store`), as an operator's runner
// leaves it after its own clone: git writes the host percent-encoded, the
// port's colon as %3a. The agent's push gets the credential all the same.
func TestGitCredentialsAsGitWritesThem(t *testing.T) {
	origin := newGitOrigin(t)
	creds := filepath.Join(t.TempDir(), "git-credentials")
	store := gitCmd("", gitEnv(t), "credential-store", "--file", creds, "store")
	store.Stdin = strings.NewReader("protocol=http\nhost=" + strings.TrimPrefix(origin.URL, "http://") + "\nusername=" + gitUser + "\npassword=" + gitToken + "\n\n")
	if out, err := store.CombinedOutput(); err != nil {
		t.Fatalf("git credential-store: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(creds); !strings.Contains(string(b), "%3a") {
		t.Fatalf("git wrote the host's port unencoded: the test reads nothing new (%d bytes)", len(b))
	}
	f := setup(t, egress.Options{GitHosts: []string{origin.URL}, GitCredentials: creds})
	env := append(gitEnv(t), f.proxy.AgentEnv(f.base)...)
	work := filepath.Join(t.TempDir(), "work")
	runGit(t, "", env, "clone", "-q", origin.URL+"/repo.git", work)
	os.WriteFile(filepath.Join(work, "AGENT.md"), []byte("agent was here\n"), 0o644)
	runGit(t, work, env, "add", "AGENT.md")
	runGit(t, work, env, "commit", "-q", "-m", "agent commit")
	runGit(t, work, env, "push", "-q", "origin", "HEAD:refs/heads/agent/t1")
	if got := runGit(t, filepath.Join(origin.root, "repo.git"), nil, "log", "--format=%s", "-1", "agent/t1"); strings.TrimSpace(got) != "agent commit" {
		t.Errorf("origin's agent/t1 is at %q", got)
	}
}

func TestGitToAnotherHostIsRefused(t *testing.T) {
	origin, other := newGitOrigin(t), newGitOrigin(t)
	f := setup(t, egress.Options{GitHosts: []string{origin.URL}})
	host := strings.TrimPrefix(other.URL, "http://")
	code, body, err := get(t, http.DefaultClient, f.base+"/git/http/"+host+"/repo.git/info/refs?service=git-upload-pack")
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, "not a git host of this project") {
		t.Fatalf("GET: %d %q %v", code, body, err)
	}
	f.hasLine(t, "orch: egress denied "+host)
	other.mu.Lock()
	defer other.mu.Unlock()
	if len(other.auth) != 0 {
		t.Fatal("the other git host was reached")
	}
}

// TestGitReachesOnlyTheProjectsRepository gives the proxy the project's
// clone URL: the runner's credential works for it and for no other
// repository on the same host, however the path is spelt.
func TestGitReachesOnlyTheProjectsRepository(t *testing.T) {
	origin := newGitOrigin(t)
	runGit(t, "", nil, "init", "-q", "--bare", "-b", "main", filepath.Join(origin.root, "other.git"))
	creds := filepath.Join(t.TempDir(), "git-credentials")
	os.WriteFile(creds, []byte(strings.Replace(origin.URL, "http://", "http://"+gitUser+":"+gitToken+"@", 1)+"\n"), 0o600)
	f := setup(t, egress.Options{GitHosts: []string{origin.URL + "/repo.git"}, GitCredentials: creds})
	env := append(gitEnv(t), f.proxy.AgentEnv(f.base)...)
	runGit(t, "", env, "clone", "-q", origin.URL+"/repo.git", filepath.Join(t.TempDir(), "ok"))
	host := strings.TrimPrefix(origin.URL, "http://")
	if out, err := gitCmd("", env, "clone", "-q", origin.URL+"/other.git", filepath.Join(t.TempDir(), "no")).CombinedOutput(); err == nil {
		t.Fatalf("clone of another repository succeeded:\n%s", out)
	}
	f.hasLine(t, "orch: egress denied "+host+"/other.git/info/refs")
	for _, p := range []string{
		"/repo.git/../other.git/info/refs?service=git-receive-pack",
		"/repo.git/%2e%2e/other.git/info/refs?service=git-receive-pack",
		"/repo.git%2f..%2fother.git/info/refs?service=git-receive-pack",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(f.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /git/http/%s%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", host, p)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s: %s", p, resp.Status)
		}
	}
	origin.mu.Lock()
	defer origin.mu.Unlock()
	for _, p := range origin.paths {
		if !strings.HasPrefix(p, "/repo.git/") || strings.Contains(p, "..") {
			t.Errorf("the origin was asked for %s", p)
		}
	}
}
