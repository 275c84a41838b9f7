// Package gateway is orch's front door: it verifies webhooks from Gitea and
// Plane, turns them into jobs on JetStream (or into the local spool while
// JetStream is away), and answers the queue API.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/services/gateway/api"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/metrics"
	"github.com/orch-dev/orch/services/gateway/queue"
	"github.com/orch-dev/orch/services/gateway/spool"
	"github.com/orch-dev/orch/services/gateway/ui"
)

// Fixed settings of the gateway.
const (
	// ShutdownGrace is how long in-flight requests may take to finish
	// once the gateway is told to stop.
	ShutdownGrace = 10 * time.Second
	// SpoolDirName is the spool's directory under ORCH_DATA_DIR.
	SpoolDirName = "spool"
)

// HTTP server timeouts. A webhook body is small and Gitea waits 5 s for
// the answer, so slow clients are cut off early.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 30 * time.Second
	IdleTimeout       = 2 * time.Minute
)

// Config is the gateway's configuration, read from ORCH_ variables; the
// envDefault tags are the defaults.
type Config struct {
	service.Common
	// HTTPAddr is the listen address.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080"`
	// ProjectsFile is the project registry; SIGHUP reloads it.
	ProjectsFile string `env:"PROJECTS_FILE" envDefault:"projects.yaml"`
	// GiteaSecret and PlaneSecret verify webhook signatures. Required.
	GiteaSecret string `env:"GITEA_SECRET"`
	PlaneSecret string `env:"PLANE_SECRET"`
	// APIToken guards every endpoint that shows or changes a job (GET
	// /queue, /jobs/...; POST /jobs...): they need Authorization: Bearer
	// APIToken. Empty turns them all off (403): the gateway must be
	// reachable by the webhook senders, so an open read would be open to
	// anyone.
	APIToken string `env:"API_TOKEN"`
	// MaxBodyBytes bounds a webhook body; larger ones get 413.
	MaxBodyBytes service.ByteSize `env:"MAX_BODY_BYTES" envDefault:"5MiB"`
	// PublicURL is the base URL of links to a job.
	PublicURL string `env:"PUBLIC_URL"`

	// Listener, when set, is used instead of listening on HTTPAddr (tests).
	Listener net.Listener `env:"-"`
}

// SetDefaults gives a Config built in Go its defaults (see
// service.SetDefaults).
func (c *Config) SetDefaults() { service.SetDefaults(c) }

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
//
// The HTTP server starts at once, even while NATS is unreachable: webhooks
// are then spooled under ORCH_DATA_DIR and carried out, in order, once
// JetStream answers.
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

	sp, err := spool.Open(filepath.Join(cfg.DataDir, SpoolDirName))
	if err != nil {
		return err
	}
	ix := index.New()
	m := metrics.New(sp.Depth, ix.Counts)
	q := queue.New(sp, ix, m, log.Named("queue"))
	srv := &api.Server{
		Log: log.Named("http"), Queue: q, Index: ix, Metrics: m, Registry: current.Load,
		GiteaSecret: cfg.GiteaSecret, PlaneSecret: cfg.PlaneSecret, APIToken: cfg.APIToken,
		MaxBodyBytes: int64(cfg.MaxBodyBytes), Now: time.Now,
	}
	dashboard := ui.New(ui.Config{
		Backend: srv, APIToken: cfg.APIToken, Log: log.Named("ui"),
		// Any gateway reads any runner's output from JOBS_LOGS.
		Logs: srv,
	})
	srv.UI = dashboard

	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return fmt.Errorf("listening: %w", err)
		}
	}

	// Background work (NATS, the index, the spool, reloads) stops only
	// after the HTTP server has finished its in-flight requests.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() { stopBG(); wg.Wait() }()

	wg.Go(func() {
		nc, js, kv, err := service.Connect(bg, cfg.Common, "gateway", log)
		if err != nil {
			return // bg ended before NATS answered
		}
		defer nc.Close()
		st := status.New(kv)
		q.Connect(nc, js, st)
		srv.Connect(nc, js, st)
		log.Info("jetstream connected", zap.Int("spool_depth", sp.Depth()))
		ix.Watch(bg, kv, log.Named("index"))
	})
	wg.Go(func() { q.Drain(bg, spool.RetryDelayDefault) })

	hup, stopHUP := service.NotifyHUP()
	defer stopHUP()
	wg.Go(func() { service.OnSignal(bg, hup, func() { reload(cfg.ProjectsFile, &current, m, log) }) })

	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	hs.RegisterOnShutdown(dashboard.Close) // followed logs must not hold up the shutdown
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }() // ends with Shutdown below, which waits for it
	log.Info("gateway listening", zap.String("addr", ln.Addr().String()), zap.Int("projects", len(reg.Projects())),
		zap.String("spool", sp.Dir()), zap.Int("spool_depth", sp.Depth()))

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
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving http: %w", err)
	}
	log.Info("gateway stopped", zap.Int("spool_depth", sp.Depth()))
	return nil
}

// reload reloads the registry (on SIGHUP). A file that does not load
// leaves the old registry in place; the error names the line.
func reload(path string, current *atomic.Pointer[registry.Registry], m *metrics.Metrics, log *zap.Logger) {
	reg, err := registry.Load(path)
	if err != nil {
		m.Reloads.WithLabelValues("error").Inc()
		log.Error("reloading the project registry failed, keeping the old one", zap.Error(err))
		return
	}
	current.Store(reg)
	m.Reloads.WithLabelValues("ok").Inc()
	log.Info("project registry reloaded", zap.String("file", path), zap.Int("projects", len(reg.Projects())))
}
