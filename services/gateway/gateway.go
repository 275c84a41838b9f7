// Package gateway is orch's front door: it verifies webhooks from Gitea and
// Plane, turns them into jobs on JetStream, and answers the queue API.
package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto/registry"
	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/proto/status"
	"github.com/orch-dev/orch/services/gateway/api"
	"github.com/orch-dev/orch/services/gateway/queue"
)

// Defaults of the gateway's settings.
const (
	HTTPAddrDefault     = ":8080"
	ProjectsFileDefault = "projects.yaml"
	MaxBodyBytesDefault = 5 << 20
	ShutdownGrace       = 10 * time.Second
)

// Config is the gateway's configuration, read from ORCH_ variables.
type Config struct {
	service.Common
	// HTTPAddr is the listen address. Default ":8080".
	HTTPAddr string `env:"HTTP_ADDR"`
	// ProjectsFile is the project registry. Default "projects.yaml".
	ProjectsFile string `env:"PROJECTS_FILE"`
	// GiteaSecret and PlaneSecret verify webhook signatures. Required.
	GiteaSecret string `env:"GITEA_SECRET"`
	PlaneSecret string `env:"PLANE_SECRET"`
	// APIToken guards the write endpoints; empty disables them.
	APIToken string `env:"API_TOKEN"`
	// MaxBodyBytes bounds a webhook body; larger ones get 413. Default 5MiB.
	MaxBodyBytes service.ByteSize `env:"MAX_BODY_BYTES"`
	// PublicURL is the base URL of links to a job.
	PublicURL string `env:"PUBLIC_URL"`

	// Listener, when set, is used instead of listening on HTTPAddr (tests).
	Listener net.Listener `env:"-"`
}

// SetDefaults fills the zero fields with their defaults.
func (c *Config) SetDefaults() {
	c.Common.SetDefaults()
	c.HTTPAddr = cmp.Or(c.HTTPAddr, HTTPAddrDefault)
	c.ProjectsFile = cmp.Or(c.ProjectsFile, ProjectsFileDefault)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, MaxBodyBytesDefault)
}

// Validate reports a configuration the gateway cannot run with.
func (c *Config) Validate() error {
	var errs []error
	if c.GiteaSecret == "" {
		errs = append(errs, errors.New("ORCH_GITEA_SECRET is required"))
	}
	if c.PlaneSecret == "" {
		errs = append(errs, errors.New("ORCH_PLANE_SECRET is required"))
	}
	if c.MaxBodyBytes <= 0 {
		errs = append(errs, errors.New("ORCH_MAX_BODY_BYTES must be positive"))
	}
	return errors.Join(errs...)
}

// Run serves until ctx is cancelled, then finishes in-flight requests.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	reg, err := registry.Load(cfg.ProjectsFile)
	if err != nil {
		return err
	}
	var current atomic.Pointer[registry.Registry]
	current.Store(reg)

	nc, js, kv, err := service.Connect(ctx, cfg.Common, "gateway", log)
	if err != nil {
		return err
	}
	defer nc.Close()

	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return fmt.Errorf("listening: %w", err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	index := api.NewIndex()
	wg.Go(func() { index.Watch(ctx, kv, log.Named("index")) })

	st := status.New(kv)
	srv := &api.Server{
		Log: log, NC: nc, JS: js, Status: st, Queue: queue.New(js, st), Index: index,
		Registry: current.Load, GiteaSecret: cfg.GiteaSecret, PlaneSecret: cfg.PlaneSecret,
		MaxBodyBytes: int64(cfg.MaxBodyBytes), Now: time.Now,
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	errc := make(chan error, 1)
	wg.Go(func() { errc <- hs.Serve(ln) })
	log.Info("gateway listening", zap.String("addr", ln.Addr().String()), zap.Int("projects", len(reg.Projects())))

	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serving http: %w", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer scancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down http: %w", err)
	}
	log.Info("gateway stopped")
	return nil
}
