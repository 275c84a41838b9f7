package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
)

// requireBwrap skips a test on a machine without bubblewrap, and fails it
// in CI, which always installs it (.ci/run).
func requireBwrap(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path, err := Probe(context.Background(), exe)
	if err != nil {
		testkit.Unavailable(t, err.Error())
	}
	return path
}

func run(t testing.TB, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// runJob runs j's sandbox with a bare environment, as the supervisor
// starts it, and returns its output and exit status. started, when not
// nil, is called once bwrap has started, before its end is awaited; from
// descriptor 3 on it has files.
func runJob(t testing.TB, j Job, started func(), files ...*os.File) (string, int) {
	t.Helper()
	argv, err := j.Command()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + j.Home}
	cmd.ExtraFiles = files
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if started != nil {
		started()
	}
	_ = cmd.Wait()
	return out.String(), cmd.ProcessState.ExitCode()
}

// worktree makes a bare clone with a worktree, as package workspace lays
// them out, and returns the worktree.
func worktree(t testing.TB, root string) string {
	t.Helper()
	src := filepath.Join(root, "src")
	run(t, root, "git", "init", "-q", "-b", "main", src)
	run(t, src, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "initial")
	bare := filepath.Join(root, "repos", "p.git")
	run(t, root, "git", "clone", "-q", "--bare", src, bare)
	wt := filepath.Join(root, "worktrees", "p", "task")
	run(t, bare, "git", "worktree", "add", "-q", "-b", "agent/task", wt, "main")
	return wt
}

// TestNpmInstalledAgentRuns: a claude installed by npm (a symlink on PATH
// to a script in a package under node_modules, run by the node its #!
// line names through /usr/bin/env) runs in the sandbox, with its package
// directory and its interpreter bound, and nothing else of their
// directories.
func TestNpmInstalledAgentRuns(t *testing.T) {
	bwrap := requireBwrap(t)
	root := t.TempDir()
	prefix := filepath.Join(root, "npm-global")
	pkg := filepath.Join(prefix, "lib", "node_modules", "@anthropic-ai", "claude-code")
	write := func(path, body string, mode os.FileMode) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(pkg, "package.json"), `{"name": "@anthropic-ai/claude-code"}`, 0o644)
	write(filepath.Join(pkg, "vendor", "data.txt"), "vendored", 0o644)
	write(filepath.Join(pkg, "cli.js"), "#!/usr/bin/env node\necho claude-ran; cat \"$(dirname \"$(readlink -f \"$0\")\")/vendor/data.txt\"; echo; cat "+filepath.Join(prefix, "secret.txt")+" 2>/dev/null && echo LEAK; exit 0\n", 0o755)
	write(filepath.Join(prefix, "secret.txt"), "secret", 0o644)
	if err := os.MkdirAll(filepath.Join(prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../lib/node_modules/@anthropic-ai/claude-code/cli.js", filepath.Join(prefix, "bin", "claude")); err != nil {
		t.Fatal(err)
	}
	// A stand-in for node: runs the script with sh.
	nodeDir := filepath.Join(root, "node", "bin")
	write(filepath.Join(nodeDir, "node"), "#!/bin/sh\nexec /bin/sh \"$@\"\n", 0o755)
	write(filepath.Join(root, "node", "other.txt"), "other", 0o644)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(prefix, "bin") + ":" + nodeDir + ":/usr/bin:/bin"
	wt := worktree(t, root)
	j := Job{Bwrap: bwrap, Init: exe, Network: NetNone, Argv: []string{"claude", "-p"}, Worktree: wt,
		Home: filepath.Join(root, "homes", "p", "task"), PATH: path}
	argv, err := j.Command()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + path, "HOME=" + j.Home}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "claude-ran\nvendored") || strings.Contains(string(out), "LEAK") {
		t.Fatalf("the npm-installed agent in the sandbox: %v\n%s", err, out)
	}
	for _, hidden := range []string{filepath.Join(prefix, "secret.txt"), filepath.Join(root, "node", "other.txt"), filepath.Join(root, "src")} {
		for _, a := range argv {
			if a == hidden {
				t.Errorf("the sandbox binds %s", hidden)
			}
		}
	}
}

// TestGitInTheSandbox: the agent commits on its branch in its worktree,
// and cannot change the clone's config or hooks, nor its worktree's .git
// file. The same holds in a worktree bound later (Later: the spare a new
// task takes, renamed to the worktree's place after bwrap has started).
func TestGitInTheSandbox(t *testing.T) {
	bwrap := requireBwrap(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, later := range []bool{false, true} {
		t.Run(map[bool]string{false: "bound at start", true: "bound later"}[later], func(t *testing.T) {
			root := t.TempDir()
			wt := worktree(t, root)
			j := Job{Bwrap: bwrap, Init: exe, Network: NetNone, Worktree: wt,
				Home: filepath.Join(root, "homes", "p", "task"), PATH: "/usr/bin:/bin"}
			var (
				started func()
				files   []*os.File
			)
			if later {
				// Elsewhere while bwrap starts and makes every other
				// mount, in place before the pipe ends: bwrap binds it
				// where it is then. Twice a pipe's capacity written is
				// read by bwrap before the write returns: bwrap is at
				// the worktree's turn then.
				text, err := os.ReadFile(filepath.Join(wt, ".git"))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(wt, wt+".spare"); err != nil {
					t.Fatal(err)
				}
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer w.Close()
				files, j.Later, j.DotGit = []*os.File{r}, 3, string(text)
				started = func() {
					if _, err := w.Write(make([]byte, 128<<10)); err != nil {
						t.Errorf("bwrap did not read the pipe: %v", err)
					}
					if err := os.Rename(wt+".spare", wt); err != nil {
						t.Error(err)
					}
					_ = w.Close()
				}
			}
			bare := filepath.Join(root, "repos", "p.git")
			j.Argv = []string{"sh", "-c", `set -u
[ "$(pwd)" = ` + j.Worktree + ` ] || echo FAIL pwd $(pwd)
echo x > file.txt && git add file.txt && git -c user.name=a -c user.email=a@a commit -q -m confined || echo FAIL commit
git config core.hooksPath /tmp 2>/dev/null && echo FAIL config
(echo evil > ` + bare + `/hooks/post-checkout) 2>/dev/null && echo FAIL hooks
(echo "gitdir: /tmp/evil" > .git) 2>/dev/null && echo FAIL dotgit
ls ` + filepath.Join(root, "src") + ` 2>/dev/null && echo FAIL source
exit 0
`}
			out, code := runJob(t, j, started, files...)
			if code != 0 || strings.Contains(out, "FAIL") {
				t.Fatalf("git in the sandbox: exit %d\n%s", code, out)
			}
			log, err := exec.Command("git", "-C", bare, "log", "-1", "--format=%s", "agent/task").CombinedOutput()
			if err != nil || strings.TrimSpace(string(log)) != "confined" {
				t.Errorf("the commit is not on agent/task: %s %v", log, err)
			}
			if _, err := os.Stat(filepath.Join(wt, "file.txt")); err != nil {
				t.Errorf("the agent's file is not in the worktree: %v", err)
			}
		})
	}
}

// TestSandboxInitOnlyWhenNeeded: with no forwarder (the network none or
// open) and no limits, bwrap starts the agent itself, no init of the
// runner's in between; with limits and no forwarder, the rlimits step
// starts it. Either way the agent's exit status, and the signal that
// killed it, come back as they would through init, and the limits hold.
func TestSandboxInitOnlyWhenNeeded(t *testing.T) {
	bwrap := requireBwrap(t)
	root := t.TempDir()
	wt := worktree(t, root)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(limits Limits, script string) (string, int, []string) {
		t.Helper()
		j := Job{Bwrap: bwrap, Init: exe, Network: NetNone, Argv: []string{"sh", "-c", script}, Worktree: wt,
			Home: filepath.Join(root, "homes", "p", "task"), PATH: "/usr/bin:/bin", Limits: limits}
		argv, err := j.Command()
		if err != nil {
			t.Fatal(err)
		}
		out, code := runJob(t, j, nil)
		return out, code, argv
	}
	out, code, argv := run(Limits{}, "echo pid $$; exit 7")
	if slices.Contains(argv, InitPath) || code != 7 || !strings.Contains(out, "pid 2") {
		t.Errorf("no limits: exit %d, %q, init bound: %v", code, out, slices.Contains(argv, InitPath))
	}
	if _, code, _ = run(Limits{}, "kill -TERM $$"); code != 128+15 {
		t.Errorf("an agent killed by SIGTERM: exit %d, want 143", code)
	}
	out, code, argv = run(Limits{MemoryMax: 512 << 20, PidsMax: 1000}, "grep -E 'Max (data size|processes)' /proc/self/limits | tr -s ' '; exit 3")
	if slices.Contains(argv, initEnv) || code != 3 || !strings.Contains(out, "Max data size 536870912 536870912") || !strings.Contains(out, "Max processes 1000 1000") {
		t.Errorf("limits: exit %d, %q (want 512 MiB and 1000 processes), init: %v", code, out, slices.Contains(argv, initEnv))
	}
}

// TestForwardedSharesItsStartersNetwork: a Forwarded job's sandbox,
// started from NetnsCommand's namespace as a forwarding supervisor
// starts it, is in that namespace (which has only a loopback), with no
// init and no socket bound in.
func TestForwardedSharesItsStartersNetwork(t *testing.T) {
	bwrap := requireBwrap(t)
	root := t.TempDir()
	wt := worktree(t, root)
	sock := filepath.Join(root, "egress.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	j := Job{Bwrap: bwrap, Init: "/nonexistent", Network: NetAllowlist, Socket: sock, Forwarded: true,
		Argv: []string{"sh", "-c", "readlink /proc/self/ns/net; grep -c : /proc/net/dev"}, Worktree: wt,
		Home: filepath.Join(root, "homes", "p", "task"), PATH: "/usr/bin:/bin"}
	argv, err := j.Command()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(argv, "--unshare-net") || slices.Contains(argv, InitPath) || slices.Contains(argv, SocketPath) {
		t.Fatalf("a forwarded job's sandbox makes its own network, or binds init or the socket: %v", argv)
	}
	outer := append(NetnsCommand(bwrap), "/bin/sh", "-c", `readlink /proc/self/ns/net; exec "$@"`, "sh")
	cmd := exec.Command(outer[0], append(outer[1:], argv...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	lines := strings.Fields(string(out))
	ours, _ := os.Readlink("/proc/self/ns/net")
	if err != nil || len(lines) != 3 || lines[0] != lines[1] || lines[0] == ours || lines[2] != "1" {
		t.Errorf("%v: %q; want the starter's namespace (not %s) twice, then 1 interface", err, out, ours)
	}

	// The runner's trial at start, which decides whether its
	// supervisors forward: it works here, and says why it does not
	// with an init that does not answer.
	exe, _ := os.Executable()
	if err := ProbeNested(context.Background(), bwrap, exe); err != nil {
		t.Errorf("ProbeNested: %v", err)
	}
	if err := ProbeNested(context.Background(), bwrap, "/bin/true"); err == nil || !strings.Contains(err.Error(), "network namespace of bwrap's") {
		t.Errorf("ProbeNested with an init that does not answer: %v", err)
	}
}

// A probe whose bwrap leaves a process behind that holds the output's
// pipe (as a nested bwrap that hangs does once its starter is killed)
// ends all the same, as a failure, rather than hold the runner's
// start-up until that process is gone.
func TestProbeEndsWhenBwrapLeavesAProcess(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "left.pid")
	fake := filepath.Join(dir, "bwrap")
	script := "#!/bin/sh\nsleep 600 &\necho $! > " + pidFile + "\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			return
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	done := make(chan error, 1)
	go func() { done <- ProbeNested(context.Background(), fake, fake) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a bwrap that failed passed the probe")
		}
	case <-time.After(time.Minute):
		t.Fatal("the probe still waits a minute after its bwrap ended, for the process it left")
	}
}
