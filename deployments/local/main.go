// Command local runs all of orch on one machine for `make run`: an
// embedded JetStream server listening where ORCH_NATS_URL points, with its
// store under ORCH_DATA_DIR and every write fsynced before it is acked,
// and the gateway, a runner and the notifier in one process. The server
// refuses anonymous clients: each service logs in as its own user, with
// the permissions of kit/natsauth, and passwords made at the first run
// and kept in ORCH_DATA_DIR/nats; the nats CLI's context for the admin
// user is written beside them (ORCH_DATA_DIR/nats/context.json). Every
// ORCH_ variable is honoured; Ctrl-C stops everything. Without ORCH_API_TOKEN
// it makes one (kept in ORCH_DATA_DIR/api-token) and prints a curl that
// uses it, since the gateway shows no job without a token, and, once the
// gateway is up, a single-use login link of the dashboard. The gateway
// listens on ORCH_HTTP_ADDR (:8080), the runner and the notifier on the next two
// ports (:8081, :8082), each with /healthz, /readyz and /metrics.
//
// The runner clones every project's clone_url. A project of the registry
// whose clone_url is a local path that does not exist yet (the sample
// registry's ./.data/sample-repo) gets a small sample git repository
// there, so `make run` works with nothing but Go and git installed.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/workspace"
)

func main() {
	gw, rn, nt, err := loadConfig()
	if err != nil {
		service.Fatal(err)
	}
	log, err := service.NewLogger(gw.Common, "local")
	if err != nil {
		service.Fatal(err)
	}
	service.Main(log, func(ctx context.Context) error { return run(ctx, gw, rn, nt, log, os.Stderr) })
}

// loadConfig reads the three services' configurations from the ORCH_
// variables.
func loadConfig() (gw gateway.Config, rn runner.Config, nt notifier.Config, err error) {
	for _, cfg := range []any{&gw, &rn, &nt} {
		if e := service.FromEnv(cfg); e != nil {
			err = errors.Join(err, e)
		}
	}
	gw.SetDefaults()
	return gw, rn, nt, err
}

// run runs the embedded server and the three services until ctx ends,
// telling the person at stdout how to read the queue.
func run(ctx context.Context, gw gateway.Config, rn runner.Config, nt notifier.Config, log *zap.Logger, stdout io.Writer) error {
	rn.SetDefaults()
	// The three services read the one ORCH_HTTP_ADDR: when it is set,
	// the runner and the notifier listen on the two ports after the
	// gateway's, else on their own defaults (:8080, :8081, :8082).
	if _, set := os.LookupEnv(service.EnvPrefix + "HTTP_ADDR"); set {
		var err error
		if rn.HTTPAddr, err = portAfter(gw.HTTPAddr, 1); err != nil {
			return err
		}
		if nt.HTTPAddr, err = portAfter(gw.HTTPAddr, 2); err != nil {
			return err
		}
	}
	var err error
	if rn.Listener, err = listenOrAny(rn.HTTPAddr, "runner", log); err != nil {
		return err
	}
	defer rn.Listener.Close() // a second Close, after the service's, is harmless
	if nt.Listener, err = listenOrAny(nt.HTTPAddr, "notifier", log); err != nil {
		return err
	}
	defer nt.Listener.Close()
	if err := sampleRepos(ctx, rn.ProjectsFile, log); err != nil {
		return err
	}
	tokenFile, err := ensureToken(&gw)
	if err != nil {
		return err
	}
	opts, err := embedded.FromURL(gw.NATSURL)
	if err != nil {
		return fmt.Errorf("ORCH_NATS_URL: %w", err)
	}
	opts.StoreDir = filepath.Join(gw.DataDir, "jetstream")
	opts.SyncAlways = true
	loginDir := filepath.Join(gw.DataDir, natsDir)
	pw, err := natsPasswords(loginDir)
	if err != nil {
		return err
	}
	for _, l := range []struct {
		c    *service.Common
		user string
	}{{&gw.Common, natsauth.Gateway}, {&rn.Common, natsauth.Runner}, {&nt.Common, natsauth.Notifier}} {
		if err := natsLogin(l.c, l.user, pw); err != nil {
			return err
		}
	}
	if opts.Users, err = embedded.Users(pw); err != nil {
		return err
	}
	natsContext := filepath.Join(loginDir, contextFile)
	if err := writeNATSContext(natsContext, gw.NATSURL, pw); err != nil {
		return err
	}
	srv, err := embedded.Start(opts)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	log.Info("embedded JetStream listening", zap.String("url", srv.URL()), zap.String("store", opts.StoreDir),
		zap.String("logins", loginDir))

	// One service failing stops the others: its error is the result.
	stopped := ctx
	g, ctx := errgroup.WithContext(ctx)
	printUsage(stdout, gw, tokenFile)
	fmt.Fprintf(stdout, "The nats CLI logs in as the admin user with the context make run wrote:\n  export NATS_CONTEXT=%s\n\n",
		absPath(natsContext))
	g.Go(func() error { return gateway.Run(ctx, gw, log.Named("gateway")) })
	g.Go(func() error { return runner.Run(ctx, rn, log.Named("runner")) })
	g.Go(func() error { return notifier.Run(ctx, nt, log.Named("notifier")) })
	g.Go(func() error { printLoginLink(ctx, stdout, gw, tokenFile, log); return nil })
	err = g.Wait()
	if stopped.Err() != nil && errors.Is(err, context.Canceled) {
		return nil // Ctrl-C while a service was still starting: a clean stop, as service.Main has it
	}
	return err
}

// absPath is path made absolute, for a line to paste in another shell.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// portAfter is addr with its port raised by n; port 0 (any free port)
// stays 0.
func portAfter(addr string, n int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("ORCH_HTTP_ADDR: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("ORCH_HTTP_ADDR: port %q: %w", port, err)
	}
	if p != 0 {
		p += n
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// listenOrAny listens on addr or, when that port is taken, on any free
// port of the same host, and says so: `make run` is for trying orch out,
// and a busy :8081 should not stop it. The log line of each service
// names the address it serves.
func listenOrAny(addr, name string, log *zap.Logger) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	host, _, _ := net.SplitHostPort(addr)
	ln, err2 := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err2 != nil {
		return nil, fmt.Errorf("ORCH_HTTP_ADDR of the %s: %w", name, errors.Join(err, err2))
	}
	log.Warn("port taken: serving /healthz, /readyz and /metrics on another", zap.String("service", name),
		zap.String("wanted", addr), zap.String("addr", ln.Addr().String()), zap.Error(err))
	return ln, nil
}

// sampleHeadBranch is the head branch of the sample pull request
// (sample/pull_request.json).
const sampleHeadBranch = "feature/fix-emoji"

// sampleRepos creates a sample git repository for every project whose
// clone_url is a local path with nothing there yet.
func sampleRepos(ctx context.Context, projectsFile string, log *zap.Logger) error {
	reg, err := registry.Load(projectsFile)
	if err != nil {
		return err
	}
	for _, p := range reg.Projects() {
		path := p.CloneURL
		if path == "" || strings.Contains(path, "://") || strings.Contains(strings.SplitN(path, "/", 2)[0], ":") {
			continue // a remote URL: nothing to make
		}
		if _, err := os.Stat(path); err == nil || !errors.Is(err, os.ErrNotExist) {
			continue
		}
		files := map[string]string{
			"README.md": "# " + p.Key + "\n\nA sample repository made by `make run` for project " + p.Key + ".\n",
			"main.go":   "package main\n\nfunc main() { println(\"hello from " + p.Key + "\") }\n",
		}
		if err := workspace.CreateRepo(ctx, path, p.DefaultBranch, files); err != nil {
			return fmt.Errorf("making the sample repository of %s: %w", p.Key, err)
		}
		// The sample pull request's head branch, so its jobs check out a
		// branch the remote has.
		if out, err := exec.CommandContext(ctx, "git", "-C", path, "branch", sampleHeadBranch).CombinedOutput(); err != nil {
			return fmt.Errorf("making branch %s in the sample repository of %s: %w: %s", sampleHeadBranch, p.Key, err, out)
		}
		log.Info("made a sample git repository", zap.String("project", p.Key), zap.String("path", path))
	}
	return nil
}
