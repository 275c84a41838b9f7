package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEtcCopiesWhatAllMayRead: the copy holds the host's files, a link
// among them followed and the links in a directory kept, and leaves out
// what others may not read and what is not in etcFiles.
func TestEtcCopiesWhatAllMayRead(t *testing.T) {
	src, other := t.TempDir(), t.TempDir()
	write(t, filepath.Join(src, "passwd"), "root:x:0:0::/root:/bin/sh\n", 0o644)
	write(t, filepath.Join(src, "group"), "secret group\n", 0o600)
	write(t, filepath.Join(src, "shadow"), "root:$6$secret\n", 0o644)
	write(t, filepath.Join(src, "ssl", "certs", "ca.pem"), "CERT\n", 0o644)
	if err := os.Symlink("ca.pem", filepath.Join(src, "ssl", "certs", "1234.0")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "ssl", "private", "key.pem"), "PRIVATE KEY\n", 0o644)
	if err := os.Chmod(filepath.Join(src, "ssl", "private"), 0o710); err != nil {
		t.Fatal(err)
	}
	// resolv.conf as systemd-resolved makes it: a link out of /etc.
	write(t, filepath.Join(other, "stub-resolv.conf"), "nameserver 127.0.0.53\n", 0o644)
	if err := os.Symlink(filepath.Join(other, "stub-resolv.conf"), filepath.Join(src, "resolv.conf")); err != nil {
		t.Fatal(err)
	}

	e, err := NewEtc(src, filepath.Join(t.TempDir(), "etc"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	dir, release := e.Acquire()
	defer release()
	for name, want := range map[string]string{
		"passwd": "root:x:0:0::/root:/bin/sh\n", "ssl/certs/ca.pem": "CERT\n", "ssl/certs/1234.0": "CERT\n",
		"resolv.conf": "nameserver 127.0.0.53\n",
	} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Errorf("%s in the copy: %q %v, want %q", name, got, err, want)
		}
	}
	if link, err := os.Readlink(filepath.Join(dir, "ssl", "certs", "1234.0")); err != nil || link != "ca.pem" {
		t.Errorf("a link in a directory: %q %v, want it kept as a link to ca.pem", link, err)
	}
	for _, name := range []string{"group", "shadow", "ssl/private"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s is in the copy (%v): others may not read it, or it is not a file a sandbox shows", name, err)
		}
	}
}

// TestEtcFollowsTheHost: a change to the host's files makes a new copy,
// which the sandboxes started after it get; one started before keeps its
// copy until it releases it, and then the copy is gone.
func TestEtcFollowsTheHost(t *testing.T) {
	src := t.TempDir()
	hosts := filepath.Join(src, "hosts")
	write(t, hosts, "127.0.0.1 localhost\n", 0o644)
	root := filepath.Join(t.TempDir(), "etc")
	e, err := NewEtc(src, root)
	if err != nil {
		t.Fatal(err)
	}
	before, release := e.Acquire()
	if changed, err := e.Refresh(); changed || err != nil {
		t.Errorf("Refresh with nothing changed: %v %v, want no new copy", changed, err)
	}
	write(t, hosts, "127.0.0.1 localhost\n10.0.0.7 git.internal\n", 0o644)
	// A second's difference, where the file system's clock is coarse.
	if err := os.Chtimes(hosts, time.Now().Add(time.Second), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if changed, err := e.Refresh(); !changed || err != nil {
		t.Fatalf("Refresh after the host's hosts changed: %v %v, want a new copy", changed, err)
	}
	after, releaseAfter := e.Acquire()
	if got, _ := os.ReadFile(filepath.Join(after, "hosts")); !strings.Contains(string(got), "git.internal") {
		t.Errorf("a sandbox started after the change sees hosts %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(before, "hosts")); strings.Contains(string(got), "git.internal") {
		t.Errorf("a sandbox started before the change had its copy changed under it: %q", got)
	}
	release()
	release() // a second call does nothing
	if _, err := os.Stat(before); !os.IsNotExist(err) {
		t.Errorf("the old copy is still there once released (%v)", err)
	}
	releaseAfter()
	if _, err := os.Stat(after); err != nil {
		t.Errorf("the current copy was removed when its last user released it: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("Close left %s (%v)", root, err)
	}
}

// TestSandboxBindsTheCopyAsEtc: a job's sandbox with Etc set has the copy
// as its /etc, read-only, and the host's /etc/ssl/private is not there.
func TestSandboxBindsTheCopyAsEtc(t *testing.T) {
	bwrap := requireBwrap(t)
	root := t.TempDir()
	wt := worktree(t, root)
	e, err := NewEtc("/etc", filepath.Join(root, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	dir, release := e.Acquire()
	defer release()
	marker := "orch-etc-" + filepath.Base(root)
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte("127.0.0.1 "+marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	j := Job{Bwrap: bwrap, Network: NetNone, Worktree: wt, Home: filepath.Join(root, "homes", "p", "task"), PATH: "/usr/bin:/bin", Etc: dir,
		Argv: []string{"sh", "-c", `cat /etc/hosts; ls /etc/ssl/private >/dev/null 2>&1 && echo private-listed
if echo x >> /etc/hosts 2>/dev/null; then echo etc-written; fi
git -C "$PWD" status --short >/dev/null && echo git-works`}}
	argv, err := j.Command()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(strings.Join(argv, " "), "-bind-try /etc/"); n != 0 {
		t.Errorf("the sandbox still binds %d files of the host's /etc: %v", n, argv)
	}
	out, code := runJob(t, j, nil)
	if code != 0 || !strings.Contains(out, marker) || !strings.Contains(out, "git-works") {
		t.Errorf("exit %d, output %q: want the copy's hosts and git working", code, out)
	}
	for _, bad := range []string{"private-listed", "etc-written"} {
		if strings.Contains(out, bad) {
			t.Errorf("the sandbox's /etc: %s", bad)
		}
	}
}

func write(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}
