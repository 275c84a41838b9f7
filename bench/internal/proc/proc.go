// Package proc builds orch's service binaries and runs them as child
// processes, the way they run in production: one process each, configured
// by ORCH_ variables. Every process it starts is reaped by Stop or Kill.
package proc

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Services are the binaries Build makes, by name.
var Services = []string{"gateway", "runner", "notifier"}

// Build compiles the three services (from this workspace, through the
// bench module's replace directives) into dir and returns their paths by
// name. The binaries are built as `make build` builds them, without the
// race detector, so what is measured is what ships: orch-sandbox-init
// too, beside the runner, where the runner finds it.
func Build(ctx context.Context, dir string) (map[string]string, error) {
	args := []string{"build", "-trimpath", "-o", dir + string(os.PathSeparator)}
	for _, s := range Services {
		args = append(args, "github.com/orch-dev/orch/services/"+s+"/cmd/"+s)
	}
	args = append(args, "github.com/orch-dev/orch/services/runner/cmd/orch-sandbox-init")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build services: %w\n%s", err, out)
	}
	bins := map[string]string{}
	for _, s := range Services {
		bins[s] = filepath.Join(dir, s)
	}
	return bins, nil
}

// BuildPackage compiles one main package of this module into dir.
func BuildPackage(ctx context.Context, dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// Proc is one running child process.
type Proc struct {
	Name string
	// LogPath receives the process's stdout and stderr.
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Start runs bin with env added to a minimal environment (PATH, HOME,
// TMPDIR), its output appended to logPath.
func Start(name, bin string, env []string, logPath string) (*Proc, error) {
	return StartArgs(name, bin, nil, env, logPath)
}

// StartArgs is Start with command-line arguments: a nats-server and its
// configuration file, say.
func StartArgs(name, bin string, args, env []string, logPath string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	defer f.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Env = append(baseEnv(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so a signal to the test's group (Ctrl-C)
	// does not race the orderly stop, and Pdeathsig, so a crashed test
	// leaves no service behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { // owned by p: it ends when the process is reaped
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func baseEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "LANG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits until the process is reaped.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, waits up to grace, then kills. It returns the
// process's exit error, nil for a clean exit.
func (p *Proc) Stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("%s did not stop within %v: killed", p.Name, grace)
	}
}

// Memory is what /proc/<pid>/status says of a process's resident memory.
type Memory struct {
	// RSS is VmRSS, the resident set now, and HWM is VmHWM, its peak.
	RSS, HWM int64 // bytes
}

// Memory reads /proc/<pid>/status.
func (p *Proc) Memory() (Memory, error) {
	if p.Exited() {
		return Memory{}, errors.New(p.Name + " has exited")
	}
	return ReadMemory(p.Pid())
}

// ReadMemory reads VmRSS and VmHWM of pid from /proc.
func ReadMemory(pid int) (Memory, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	var m Memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("parsing %s of %d: %w", k, pid, err)
		}
		*dst = kb << 10
	}
	return m, sc.Err()
}

// Tail returns the last n lines of the process's log, for error messages.
func (p *Proc) Tail(n int) string {
	data, _ := os.ReadFile(p.LogPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ServiceEnv is the environment every service of a bench or soak run
// gets: the server at natsURL, its own data directory under dir (by
// name), the registry, and any free port for /healthz, /readyz and
// /metrics, never the fixed defaults (two runners run at once); a
// gateway's own ORCH_HTTP_ADDR comes later and wins. The log level is
// info unless ORCH_LOG_LEVEL is set where the bench runs (debug shows,
// for one, the runner's fair-share deferrals in the logs -keep leaves).
func ServiceEnv(natsURL, dir, registry, name string) []string {
	level := cmp.Or(os.Getenv("ORCH_LOG_LEVEL"), "info")
	return []string{
		"ORCH_NATS_URL=" + natsURL,
		"ORCH_DATA_DIR=" + filepath.Join(dir, "data-"+name),
		"ORCH_PROJECTS_FILE=" + registry,
		"ORCH_LOG_LEVEL=" + level,
		"ORCH_HTTP_ADDR=127.0.0.1:0",
	}
}
