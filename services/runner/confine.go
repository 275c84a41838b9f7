package runner

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
	"github.com/orch-dev/orch/services/runner/egress"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// What a job's record says of its confinement (proto.Status.Sandbox and
// Limits).
const (
	sandboxNone  = "none"
	sandboxBwrap = "bwrap"
	limitsNone   = "none"
	limitsRlimit = "rlimit"
)

// modelUpstreamDefault is the model API when the runner's environment
// names none in ANTHROPIC_BASE_URL.
const modelUpstreamDefault = "https://api.anthropic.com"

// confinement is how this runner runs its agents, decided at start.
type confinement struct {
	// bwrap is bubblewrap's path; "" runs agents unconfined.
	bwrap string
	// init is the program every sandbox's init and every rlimits step
	// runs as (sandbox.FindInit): orch-sandbox-init, or the runner's
	// own executable, exe.
	init, exe string
	network   sandbox.Network
	limits    sandbox.Limits
	// nested says a sandbox works within a network namespace made by
	// bwrap (sandbox.ProbeNested): under the allowlist, supervisors
	// forward from such namespaces (forwards).
	nested bool
	// why auto runs agents unconfined: bwrap's trial at start failed.
	why string
	// etc is the sandboxes' copy of the host's /etc; nil, they bind the
	// host's files one by one.
	etc *sandbox.Etc
}

// hostVars never reach a confined agent: the egress proxy holds the
// credentials, and the agent gets placeholders and the proxy's addresses
// from it instead; the runner's HOME, TMPDIR and ssh agent are not in the
// sandbox (it gets a HOME of its task's and /tmp).
var hostVars = []string{
	"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
	"SSH_AUTH_SOCK", "HOME", "TMPDIR",
}

// proxyVars are the proxy settings an agent on the open network is not
// given: it reaches hosts itself, and the proxy only for the model API
// and its git host's credential.
var proxyVars = []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy"}

// chooseConfinement decides at start how agents run and says so: a
// warning when auto falls back to unconfined, the metric, /readyz.
func chooseConfinement(ctx context.Context, cfg Config, log *zap.Logger) (confinement, error) {
	c := confinement{network: cfg.AgentNetwork, limits: sandbox.Limits{MemoryMax: int64(cfg.AgentMemoryMax), PidsMax: cfg.AgentPidsMax}}
	exe, err := os.Executable()
	if err != nil && cfg.AgentSandbox != sandbox.ModeNone {
		return c, fmt.Errorf("finding the runner's executable, every sandbox's init: %w", err)
	}
	init, note, err := sandbox.FindInit(ctx, cfg.AgentSandboxInit, exe)
	if err != nil {
		return c, err
	}
	if note != "" {
		log.Warn("agents' sandbox init: "+sandbox.InitName+" beside the runner passed over", zap.String("reason", note))
	}
	c.init, c.exe = init, exe
	bwrap, warn, err := sandbox.Choose(ctx, cfg.AgentSandbox, init)
	if err != nil {
		return c, err
	}
	c.bwrap, c.why = bwrap, warn
	if bwrap != "" && c.network == sandbox.NetAllowlist {
		err := sandbox.ProbeNested(ctx, bwrap, init)
		if c.nested = err == nil; !c.nested {
			log.Warn("agents' supervisors cannot run in network namespaces of their own here: each confined job starts init in its sandbox to forward to the egress proxy, a program's start more per job",
				zap.Error(err))
		}
	}
	switch {
	case bwrap != "":
		log.Info("agents run confined by bubblewrap", zap.String("bwrap", bwrap), zap.String("network", string(c.network)), zap.String("init", init))
	case cfg.AgentSandbox == sandbox.ModeAuto:
		log.Warn("agents run UNCONFINED: bubblewrap does not work on this host (ORCH_AGENT_SANDBOX=auto); every agent can read what the runner can, its credentials included; set ORCH_AGENT_SANDBOX=bwrap to refuse to start instead",
			zap.String("reason", warn))
	default:
		log.Warn("agents run UNCONFINED (ORCH_AGENT_SANDBOX=none): every agent can read what the runner can, its credentials included")
	}
	if c.limits.PidsMax > 0 && os.Geteuid() == 0 {
		log.Warn("ORCH_AGENT_PIDS_MAX is an rlimit (RLIMIT_NPROC), which the kernel does not apply to root: run the runner as a non-root user for it to bind")
	}
	return c, nil
}

// forwards reports whether agents' supervisors forward to the egress
// proxy from network namespaces of their own (agent.Forwarding): under
// the allowlist, where a sandbox has no network but that, on a host
// where a sandbox works in such a namespace; elsewhere init forwards,
// inside each sandbox.
func (c confinement) forwards() bool {
	return c.bwrap != "" && c.network == sandbox.NetAllowlist && c.nested
}

// forwarding is how the runner's supervisors are to be started.
func (c confinement) forwarding() *agent.Forwarding {
	if !c.forwards() {
		return nil
	}
	return &agent.Forwarding{Wrap: sandbox.NetnsCommand(c.bwrap), Port: sandbox.ForwardPort}
}

// detail is what /readyz says of the confinement: the sandbox, and, when
// agents run unconfined, a warning saying so and why.
func (c confinement) detail() map[string]any {
	d := map[string]any{"sandbox": c.sandboxName()}
	if c.bwrap != "" {
		d["network"] = string(c.network)
		return d
	}
	d["warning"] = "agents run unconfined: every agent can read what the runner can, its credentials included"
	if c.why != "" {
		d["warning"] = d["warning"].(string) + " (bubblewrap does not work here: " + c.why + ")"
	}
	return d
}

// sandboxName is what a job's record says of the sandbox.
func (c confinement) sandboxName() string {
	if c.bwrap == "" {
		return sandboxNone
	}
	return sandboxBwrap
}

// networkName is what a job's record says of the agent's network.
func (c confinement) networkName() string {
	if c.bwrap == "" {
		return ""
	}
	return string(c.network)
}

// limitsName is what a job's record says of the limits.
func (c confinement) limitsName() string {
	if c.limits.Set() {
		return limitsRlimit
	}
	return limitsNone
}

// record writes the confinement into a job's record.
func (c confinement) record(st *proto.Status) {
	st.Sandbox, st.Network, st.Limits = c.sandboxName(), c.networkName(), c.limitsName()
}

// confine turns spec into the confined run of job's agent in the worktree
// dir: the sandbox's command, an environment without the runner's
// credentials, the task's home, and the job's egress proxy, which the
// returned stop closes (after the agent ended). The proxy serves once
// listen is called, which may be after the sandbox is started and must
// be before its agent starts: the proxy's socket is not on the way to
// the sandbox. Unconfined, it only puts the limits on the agent. later,
// when set, holds back the worktree's binding until the spare the
// sandbox is made on is the task's (prestart.go).
func (r *Runner) confine(log *zap.Logger, job *proto.Job, p *registry.Project, dir string, later *laterBind, spec *agent.Spec) (stop func(), listen func() error, err error) {
	listen = listening
	c := r.conf
	if c.bwrap == "" {
		// The rlimits step: orch-sandbox-init, or the runner's own
		// executable as the supervisor's /proc/self/exe, which still
		// runs when the file on disk has been replaced.
		step := c.init
		if step == c.exe {
			step = "/proc/self/exe"
		}
		var v string
		if spec.Argv, v = c.limits.Wrap(step, spec.Argv); v != "" {
			spec.Env = append(spec.Env, v)
		}
		return func() {}, listen, nil
	}
	// The sandbox's command makes the home when missing (sandbox.Job).
	home := r.homePath(job)
	env := slices.DeleteFunc(slices.Clone(spec.Env), func(kv string) bool {
		return slices.ContainsFunc(hostVars, func(name string) bool { return strings.HasPrefix(kv, name+"=") })
	})
	env = append(env, "HOME="+home, "TMPDIR=/tmp")

	// Every sandbox has a gate: the agent starts when its supervisor
	// is told, so that one made ahead (prestart.go) runs nothing early.
	sj := sandbox.Job{
		Bwrap: c.bwrap, Init: c.init, Network: c.network, Argv: spec.Argv, Worktree: dir, Home: home,
		Origin: localOrigin(p.CloneURL), RO: r.cfg.AgentSandboxRO, RW: r.cfg.AgentSandboxRW,
		Limits: c.limits, PATH: envValue(env, "PATH"), Gate: agent.GateFD,
	}
	if later != nil {
		// Given to bwrap after the gate. The supervisor does not start
		// in dir, which is not there yet.
		sj.Later, sj.DotGit = agent.GateFD+1, later.dotGit
		spec.Files, spec.Dir = []*os.File{later.r}, "/"
	}
	releaseEtc := func() {}
	if c.etc != nil {
		sj.Etc, releaseEtc = c.etc.Acquire()
	}
	stop = releaseEtc
	if c.network != sandbox.NetNone {
		proxy, base, sock, serve, err := r.startEgress(log, job, p, spec.Notes)
		if err != nil {
			releaseEtc()
			return nil, nil, err
		}
		listen = serve
		// The proxy's meter, for the spend watch and a usage limit's 429
		// (meters.go).
		r.meters.Store(job.ID, proxy)
		stop = func() {
			releaseEtc()
			r.meters.Delete(job.ID)
			u := proxy.Usage()
			if err := proxy.Close(); err != nil {
				log.Warn("closing the egress proxy", zap.Error(err))
			}
			if sock != "" {
				_ = os.RemoveAll(filepath.Dir(sock))
			}
			if u.Requests > 0 {
				log.Info("model requests through the egress proxy", zap.Int64("requests", u.Requests),
					zap.Int64("input_tokens", u.InputTokens), zap.Int64("output_tokens", u.OutputTokens),
					zap.Float64("metered_cost_usd", u.CostUSD))
			}
		}
		sj.Socket = sock
		if c.forwards() {
			// The supervisor forwards, from its own network
			// namespace, which the sandbox shares (agent.Forwarding).
			sj.Forwarded, spec.Forward = true, sock
		} else {
			// The socket is bound into the sandbox: it is to be there
			// when bwrap starts.
			if err := listen(); err != nil {
				stop()
				return nil, nil, err
			}
			listen = listening
		}
		agentEnv := proxy.AgentEnv(base)
		if c.network == sandbox.NetOpen {
			agentEnv = slices.DeleteFunc(agentEnv, func(kv string) bool {
				return slices.ContainsFunc(proxyVars, func(name string) bool { return strings.HasPrefix(kv, name+"=") })
			})
		}
		env = append(env, agentEnv...)
	}
	argv, err := sj.Command()
	if err != nil {
		stop()
		return nil, nil, err
	}
	spec.Argv, spec.Env, spec.Gated = argv, env, true
	return stop, listen, nil
}

// startEgress makes job's egress proxy: on a unix socket in a private
// directory of its own, which the sandbox's init or the supervisor
// forwards to, once listen is called; or, on the open network, on the
// host's loopback at once (listen does nothing). base is the proxy's
// address as the agent sees it; sock is "" on the open network.
func (r *Runner) startEgress(log *zap.Logger, job *proto.Job, p *registry.Project, notes *agent.Notes) (proxy *egress.Proxy, base, sock string, listen func() error, err error) {
	upstream := cmp.Or(os.Getenv("ANTHROPIC_BASE_URL"), modelUpstreamDefault)
	allow := slices.Concat(r.cfg.AgentEgress, p.Egress)
	var gitHosts []string
	if h, origin := gitHost(p.CloneURL); h != "" {
		allow = append(allow, h)
		if origin != "" {
			gitHosts = append(gitHosts, origin)
		}
	}
	if h, _ := gitHost(upstream); h != "" {
		allow = append(allow, h)
	}
	_, project := r.metrics.labels(job)
	o := egress.Options{
		Project: job.Project, Allow: allow, GitHosts: gitHosts, ModelUpstream: upstream,
		APIKey: os.Getenv("ANTHROPIC_API_KEY"), OAuthToken: os.Getenv("CLAUDE_CODE_OAUTH_TOKEN"),
		GitCredentials: r.cfg.GitCredentialsFile,
		Prices:         r.prices,
		LogAllowed:     log.Core().Enabled(zap.DebugLevel),
		JobLog:         notes.Line,
		OnDenied:       func(string) { r.metrics.egressDenied.WithLabelValues(project).Inc() },
		Logger:         log,
	}
	if r.conf.network == sandbox.NetOpen {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", "", nil, fmt.Errorf("egress proxy: %w", err)
		}
		proxy, err := egress.Serve(ln, o)
		if err != nil {
			return nil, "", "", nil, err
		}
		return proxy, "http://" + ln.Addr().String(), "", listening, nil
	}
	if proxy, err = egress.New(o); err != nil {
		return nil, "", "", nil, err
	}
	// A unix socket's path has room for about 100 bytes: the system's
	// temporary directory, not the workspace, holds it, in a directory
	// only the runner may enter, made by listen (a name taken meanwhile
	// fails it).
	runDir := filepath.Join(os.TempDir(), "orch-job-"+rand.Text())
	sock = filepath.Join(runDir, "egress.sock")
	listen = func() error {
		if err := os.Mkdir(runDir, 0o700); err != nil {
			return fmt.Errorf("egress proxy: %w", err)
		}
		return proxy.Listen(sock)
	}
	return proxy, "http://127.0.0.1:" + strconv.Itoa(sandbox.ForwardPort), sock, listen, nil
}

// listening is the listen of a job with no egress proxy, or whose proxy
// serves already.
func listening() error { return nil }

// refreshEtc keeps the sandboxes' copy of the host's /etc current
// (sandbox.Etc) until ctx ends.
func (r *Runner) refreshEtc(ctx context.Context) {
	if r.conf.etc == nil {
		return
	}
	t := time.NewTicker(sandbox.EtcRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := r.conf.etc.Refresh()
		switch {
		case err != nil:
			r.log.Warn("refreshing the sandboxes' copy of /etc: they keep the last one", zap.Error(err))
		case changed:
			r.log.Info("the host's /etc changed: the sandboxes started from now on see it")
		}
	}
}

// homeDir is the private HOME of job's task, made when missing. It is
// kept in the workspace between the task's jobs (an agent's own state,
// such as ~/.claude), and removed with the task's worktree by its
// cleanup job.
func (r *Runner) homeDir(job *proto.Job) (string, error) {
	home := r.homePath(job)
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", fmt.Errorf("creating the task's home: %w", err)
	}
	return home, nil
}

// homePath is where job's task has its private HOME (homeDir).
func (r *Runner) homePath(job *proto.Job) string {
	return filepath.Join(r.ws.Root, "homes", proto.Token(job.Project), proto.Token(job.Task.ID))
}

// scpLike is git's user@host:path form of a remote.
var scpLike = regexp.MustCompile(`^[^/:]+:`)

// localOrigin is cloneURL's path when it is a local path (tests, a
// repository on the runner's disk), else "".
func localOrigin(cloneURL string) string {
	if u, ok := strings.CutPrefix(cloneURL, "file://"); ok {
		return u
	}
	if cloneURL == "" || strings.Contains(cloneURL, "://") || scpLike.MatchString(cloneURL) {
		return ""
	}
	abs, err := filepath.Abs(cloneURL)
	if err != nil {
		return ""
	}
	if _, err := os.Stat(abs); err != nil {
		return ""
	}
	return abs
}

// gitHost is the host:port a URL's requests go to (port 443 or 80 by
// scheme when it names none), and its origin (scheme://host[:port]) when
// it is http or https; "" for a local path.
func gitHost(raw string) (hostport, origin string) {
	if m := scpLike.FindString(raw); m != "" && !strings.Contains(raw, "://") {
		host := strings.TrimSuffix(m, ":")
		if i := strings.LastIndexByte(host, '@'); i >= 0 {
			host = host[i+1:]
		}
		return net.JoinHostPort(host, "22"), ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", ""
	}
	port := u.Port()
	switch {
	case port != "":
	case u.Scheme == "http":
		port = "80"
	case u.Scheme == "ssh":
		port = "22"
	default:
		port = "443"
	}
	hostport = net.JoinHostPort(u.Hostname(), port)
	if u.Scheme == "http" || u.Scheme == "https" {
		origin = u.Scheme + "://" + u.Host
	}
	return hostport, origin
}

// envValue is the value of name in env ("KEY=value" entries), the last
// one winning.
func envValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if s, ok := strings.CutPrefix(kv, name+"="); ok {
			v = s
		}
	}
	return v
}

// outOfMemory are the words a program's last output has when an
// allocation failed: libc's strerror, Node's and V8's, Go's, Python's,
// C++'s, the shells' and awk's.
var outOfMemory = regexp.MustCompile(`(?i)out of memory|cannot allocate memory|\benomem\b|bad_alloc|memoryerror|allocation failed`)

// oomTail is how much of the end of an agent's log judgeLimits reads.
const oomTail = 64 << 10

// judgeLimits names the memory limit in the error of an agent that
// failed under one and whose output ends saying an allocation failed.
// An rlimit does not kill: the allocation fails and the program decides
// what to do (most print one of outOfMemory and exit), so this is what
// the runner can honestly tell.
func (c confinement) judgeLimits(res agent.Result, logPath string) agent.Result {
	if c.limits.MemoryMax <= 0 || res.Err == nil || errors.Is(res.Err, agent.ErrTimeout) {
		return res
	}
	f, err := os.Open(logPath)
	if err != nil {
		return res
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return res
	}
	off := max(fi.Size()-oomTail, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return res
	}
	if outOfMemory.Match(buf) {
		res.Err = fmt.Errorf("agent ran out of memory: ORCH_AGENT_MEMORY_MAX=%d bytes (RLIMIT_DATA, per process) refused an allocation: %w", c.limits.MemoryMax, res.Err)
	}
	return res
}
