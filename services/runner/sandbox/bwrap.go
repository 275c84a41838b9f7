package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// InitPath is where the init program (FindInit) is bound in every sandbox.
const InitPath = "/run/orch/init"

// SocketPath is where the egress proxy's unix socket is bound.
const SocketPath = "/run/orch/egress.sock"

// ForwardPort is the port on the sandbox's loopback where init forwards
// to the egress proxy. Every sandbox has its own network namespace under
// the allowlist, so one fixed port serves them all.
const ForwardPort = 3128

// Job is what one confined run of an agent may see and do.
type Job struct {
	// Bwrap is bwrap's path (Choose).
	Bwrap string
	// Init is the init program on the host (FindInit).
	Init string
	// Network is what the agent may reach.
	Network Network
	// Socket is the egress proxy's unix socket on the host, which init
	// forwards 127.0.0.1:ForwardPort to; empty, no forwarder (the network
	// none, or open, where the agent reaches the proxy on the host's
	// loopback itself).
	Socket string
	// Forwarded says bwrap is started from a network namespace of its
	// own (NetnsCommand) where 127.0.0.1:ForwardPort already leads to
	// the egress proxy: the sandbox shares that namespace instead of
	// making one, and Socket is not bound in, nor init started to
	// forward.
	Forwarded bool
	// Argv is the agent's command, as the runner would run it.
	Argv []string
	// Worktree is the task's worktree, the working directory.
	Worktree string
	// Later, when above 0, is a descriptor bwrap is started with: bwrap
	// binds the worktree only once it has read that pipe to its end, after
	// every other mount, so Worktree need not be there before; DotGit is
	// then the text of the .git file it will have. The runner makes a
	// sandbox ahead so on the project's spare worktree, which a new
	// task's checkout renames to Worktree after bwrap has started and
	// resolved every other source (prestart.go).
	Later  int
	DotGit string
	// Home is the task's private HOME, kept between its jobs.
	Home string
	// Origin is the project's clone_url when it is a local path, bound
	// so that the agent can push to it, with its config and hooks
	// read-only; "" for a URL.
	Origin string
	// RO and RW are the operator's own paths (ORCH_AGENT_SANDBOX_RO and
	// ORCH_AGENT_SANDBOX_RW).
	RO, RW []string
	// Limits are applied to the agent by init (see Limits).
	Limits Limits
	// PATH is the agent's PATH, where its program is looked up.
	PATH string
	// Etc is a copy of the host's /etc (Etc.Acquire), bound as the
	// sandbox's /etc in one mount; "" binds the host's files one by one.
	Etc string
	// Gate, when above 0, is a descriptor bwrap is started with: once
	// the sandbox is made, bwrap waits until it can read a byte from it
	// (or its end of file), closes it, then starts the agent (bwrap's
	// --block-fd; see agent.Prestart).
	Gate int
}

// Command is the argv that runs j's agent in its sandbox: bwrap, its
// options, then init and the agent's own argv. Every path it binds must
// exist: the worktree, its git directories and the home are made by the
// runner before (Home is created here when missing).
func (j Job) Command() ([]string, error) {
	if len(j.Argv) == 0 {
		return nil, errors.New("empty agent command")
	}
	if err := os.MkdirAll(j.Home, 0o700); err != nil {
		return nil, fmt.Errorf("creating the task's home: %w", err)
	}
	args := []string{j.Bwrap}
	if j.Forwarded {
		args = append(args, namespaceArgs(NetOpen)...) // the starter's own network
	} else {
		args = append(args, namespaceArgs(j.Network)...)
	}
	args = append(args, systemArgs(j.Etc)...)
	args = append(args, "--tmpfs", "/tmp", "--dir", "/run/orch")
	if j.Gate > 0 {
		args = append(args, "--block-fd", strconv.Itoa(j.Gate))
	}

	progs, err := programArgs(j.Argv, j.PATH)
	if err != nil {
		return nil, err
	}
	args = append(args, progs...)
	for _, p := range j.RO {
		args = append(args, "--ro-bind", p, p)
	}
	dotGit := ""
	if j.Later > 0 {
		if dotGit = j.DotGit; dotGit == "" {
			return nil, errors.New("a worktree bound later needs its .git file's text")
		}
	}
	worktree, git, err := gitArgs(j.Worktree, dotGit)
	if err != nil {
		return nil, err
	}
	if j.Later == 0 {
		args = append(args, worktree...)
	}
	args = append(args, git...)
	if j.Origin != "" {
		args = append(args, "--bind", j.Origin, j.Origin)
		for _, f := range []string{"config", "hooks", ".git/config", ".git/hooks"} {
			args = append(args, "--ro-bind-try", filepath.Join(j.Origin, f), filepath.Join(j.Origin, f))
		}
	}
	args = append(args, "--bind", j.Home, j.Home)
	for _, p := range j.RW {
		args = append(args, "--bind", p, p)
	}

	// Last, the worktree when it is bound later (bwrap resolves the
	// sources it binds when it starts, and a missing one is skipped by
	// --bind-try then, not at its mount), the working directory, and the
	// sandbox's own root, where bwrap made the mount points, read-only
	// too.
	run := func(argv ...string) []string {
		if j.Later > 0 {
			args = append(append(args, "--file", strconv.Itoa(j.Later), "/run/orch/worktree"), worktree...)
		}
		args = append(args, "--chdir", j.Worktree, "--remount-ro", "/", "--")
		return append(args, argv...)
	}
	spec := initSpec{Limits: j.Limits}
	if j.Socket != "" && !j.Forwarded {
		spec.Port = ForwardPort
		spec.Socket = SocketPath
		args = append(args, "--ro-bind", j.Socket, SocketPath)
	}
	switch {
	case spec.Port == 0 && !spec.Limits.Set():
		// Nothing for init to do: bwrap's own pid 1 starts the agent,
		// and its end ends the sandbox (a Go program's start less).
		return run(j.Argv...), nil
	case spec.Port == 0:
		// Only the rlimits: their step, which execs the agent.
		argv, env := j.Limits.Wrap(InitPath, j.Argv)
		name, value, _ := strings.Cut(env, "=")
		args = append(args, "--ro-bind", j.Init, InitPath, "--setenv", name, value)
		return run(argv...), nil
	}
	args = append(args, "--ro-bind", j.Init, InitPath, "--setenv", initEnv, spec.String())
	return run(append([]string{InitPath}, j.Argv...)...), nil
}

// systemDirs are the host's system directories, bound read-only (or, where
// the host has a symlink such as /bin -> usr/bin, made the same symlink).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// etcFiles are the parts of /etc a program needs: users and groups, name
// resolution, TLS certificates, the dynamic linker's cache, Debian's
// alternatives (the targets of /usr/bin/editor and such), the time zone,
// git's system config.
var etcFiles = []string{
	"passwd", "group", "hosts", "host.conf", "resolv.conf", "nsswitch.conf", "gai.conf",
	"ssl", "ca-certificates", "ca-certificates.conf", "pki", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
	"alternatives", "localtime", "timezone", "gitconfig", "mime.types", "protocols", "services",
}

// systemArgs bind the system read-only, etc (a copy made by Etc) or the
// host's etcFiles as the sandbox's /etc, a fresh /proc of the sandbox's
// own pid namespace and a minimal /dev.
func systemArgs(etc string) []string {
	var args []string
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				args = append(args, "--symlink", target, d)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	if etc != "" {
		args = append(args, "--ro-bind", etc, "/etc")
	} else {
		for _, f := range etcFiles {
			args = append(args, "--ro-bind-try", "/etc/"+f, "/etc/"+f)
		}
	}
	return append(args, "--proc", "/proc", "--dev", "/dev")
}

// underSystem reports whether path is in one of the system directories,
// which every sandbox has already.
func underSystem(path string) bool {
	return slices.ContainsFunc(systemReal(), func(real string) bool { return within(path, real) })
}

// systemReal is where the system directories really are, their symlinks
// followed, as read once: a host does not move /usr under a running
// runner.
var systemReal = sync.OnceValue(func() []string {
	var reals []string
	for _, d := range systemDirs {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			reals = append(reals, real)
		}
	}
	return reals
})

// within reports whether path is dir or inside it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// gitArgs give the agent its worktree and, of the project's clone, what
// git needs to commit in it: objects, refs and logs writable, the
// worktree's own record (HEAD, index) writable, the rest (config, hooks,
// packed-refs, the other worktrees' records) read-only or hidden. The
// worktree's .git file is read-only: rewritten, it could point the
// runner's own git, which runs outside the sandbox, at a config of the
// agent's. The worktree's own binds are apart from the clone's (git):
// when dotGit, the .git file's text, is given, the worktree need not be
// there yet, and its binds are skipped if it is not there when made.
func gitArgs(worktree, dotGit string) (own, git []string, err error) {
	dotGitPath := filepath.Join(worktree, ".git")
	bind, roBind := "--bind-try", "--ro-bind-try"
	if dotGit == "" {
		bind, roBind = "--bind", "--ro-bind"
		b, err := os.ReadFile(dotGitPath)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the worktree's .git: %w", err)
		}
		dotGit = string(b)
	}
	own = []string{bind, worktree, worktree, roBind, dotGitPath, dotGitPath}
	gitDir, ok := strings.CutPrefix(strings.TrimSpace(dotGit), "gitdir: ")
	if !ok {
		return nil, nil, fmt.Errorf("%s is not a worktree's .git file", dotGitPath)
	}
	if !filepath.IsAbs(gitDir) {
		gitDir = filepath.Join(worktree, gitDir)
	}
	common := gitDir
	if c, err := os.ReadFile(filepath.Join(gitDir, "commondir")); err == nil {
		common = strings.TrimSpace(string(c))
		if !filepath.IsAbs(common) {
			common = filepath.Join(gitDir, common)
		}
	}
	common = filepath.Clean(common)
	// A reflog git cannot create in the read-only clone fails the commit.
	if err := os.MkdirAll(filepath.Join(common, "logs"), 0o755); err != nil {
		return nil, nil, fmt.Errorf("creating the clone's logs: %w", err)
	}
	git = append(git,
		"--ro-bind", common, common,
		"--tmpfs", filepath.Join(common, "worktrees"),
		"--bind", gitDir, gitDir,
		"--bind", filepath.Join(common, "objects"), filepath.Join(common, "objects"),
		"--bind", filepath.Join(common, "refs"), filepath.Join(common, "refs"),
		"--bind", filepath.Join(common, "logs"), filepath.Join(common, "logs"))
	return own, git, nil
}
