// Command local runs all of orch on one machine for `make run`: an
// embedded JetStream server listening where ORCH_NATS_URL points, with its
// store under ORCH_DATA_DIR and every write fsynced before it is acked,
// and the gateway, a runner and the notifier in one process. Every ORCH_
// variable is honoured; Ctrl-C stops everything.
//
// The runner clones every project's clone_url. A project of the registry
// whose clone_url is a local path that does not exist yet (the sample
// registry's ./.data/sample-repo) gets a small sample git repository
// there, so `make run` works with nothing but Go and git installed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto/embedded"
	"github.com/orch-dev/orch/proto/registry"
	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/workspace"
)

func main() {
	var (
		gw  gateway.Config
		rn  runner.Config
		nt  notifier.Config
		err error
	)
	for _, cfg := range []any{&gw, &rn, &nt} {
		if e := service.FromEnv(cfg); e != nil {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		service.Fatal(err)
	}
	gw.SetDefaults()
	log, err := service.NewLogger(gw.Common, "local")
	if err != nil {
		service.Fatal(err)
	}
	if gw.APIToken == "" {
		// The dashboard and the write endpoints need a token; a local run
		// makes one up rather than leave them off.
		gw.APIToken = randomToken()
	}
	fmt.Fprintf(os.Stderr, "\n  orch dashboard: %s\n  (a login link: it holds ORCH_API_TOKEN, keep it to yourself)\n\n", dashboardLink(gw))
	service.Main(log, func(ctx context.Context) error { return run(ctx, gw, rn, nt, log) })
}

func run(ctx context.Context, gw gateway.Config, rn runner.Config, nt notifier.Config, log *zap.Logger) error {
	rn.SetDefaults()
	if err := sampleRepos(ctx, rn.ProjectsFile, log); err != nil {
		return err
	}
	opts, err := embedded.FromURL(gw.NATSURL)
	if err != nil {
		return fmt.Errorf("ORCH_NATS_URL: %w", err)
	}
	opts.StoreDir = filepath.Join(gw.DataDir, "jetstream")
	opts.SyncAlways = true
	srv, err := embedded.Start(opts)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	log.Info("embedded JetStream listening", zap.String("url", srv.URL()), zap.String("store", opts.StoreDir))

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	services := []func() error{
		func() error { return gateway.Run(ctx, gw, log.Named("gateway")) },
		func() error { return runner.Run(ctx, rn, log.Named("runner")) },
		func() error { return notifier.Run(ctx, nt, log.Named("notifier")) },
	}
	for i, svc := range services {
		wg.Go(func() {
			errs[i] = svc()
			if errs[i] != nil {
				cancel(errs[i]) // one service failing stops the others
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// randomToken returns a fresh API token.
func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// dashboardLink is the one-time login link of the gateway's dashboard:
// under ORCH_PUBLIC_URL when set, else on this host's ORCH_HTTP_ADDR.
func dashboardLink(gw gateway.Config) string {
	base := strings.TrimRight(gw.PublicURL, "/")
	if base == "" {
		host, port, err := net.SplitHostPort(gw.HTTPAddr)
		if err != nil {
			host, port = "", "8080"
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "localhost"
		}
		base = "http://" + net.JoinHostPort(host, port)
	}
	return base + "/ui/login?token=" + url.QueryEscape(gw.APIToken)
}

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
		log.Info("made a sample git repository", zap.String("project", p.Key), zap.String("path", path))
	}
	return nil
}
