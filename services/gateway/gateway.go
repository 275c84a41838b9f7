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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/api"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/jobs"
	"github.com/orch-dev/orch/services/gateway/metrics"
	"github.com/orch-dev/orch/services/gateway/planenames"
	"github.com/orch-dev/orch/services/gateway/queue"
	"github.com/orch-dev/orch/services/gateway/spool"
	"github.com/orch-dev/orch/services/gateway/throttle"
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
	// PlaneAgentSecret verifies the webhooks of a Plane agent app (its
	// runs, POST /webhooks/plane-agent): the app's own secret, not the
	// workspace webhook's. Empty refuses them (401).
	PlaneAgentSecret string `env:"PLANE_AGENT_SECRET"`
	// APIToken guards every endpoint that shows or changes a job (GET
	// /queue, /jobs/...; POST /jobs...) and POST /ui/login-links, which
	// makes the dashboard's login links: they need Authorization: Bearer
	// APIToken. Empty turns them all off (403): the gateway must be
	// reachable by the webhook senders, so an open read would be open to
	// anyone. A set token has at least APITokenMinLength characters.
	APIToken string `env:"API_TOKEN"`
	// TrustedProxies are the addresses or networks (10.0.0.0/8) of the
	// proxies in front of the gateway whose X-Forwarded-For names the
	// client that failed logins are counted against. Empty: the client
	// is the connection's address, whatever the headers say.
	TrustedProxies []string `env:"TRUSTED_PROXIES" envSeparator:","`
	// BudgetTZ is the budgets' calendar (an IANA zone), as the runners'
	// ORCH_BUDGET_TZ: the dashboard shows each project's spend today and
	// this month in it.
	BudgetTZ string `env:"BUDGET_TZ" envDefault:"UTC"`
	// MaxBodyBytes bounds a webhook body; larger ones get 413.
	MaxBodyBytes service.ByteSize `env:"MAX_BODY_BYTES" envDefault:"5MiB"`
	// MaxTaskBytes bounds a job as it is published: the text a person
	// wrote (the task's body, the trigger text, the title) is cut to fit,
	// with a marker naming where the whole text is. At most
	// MaxTaskBytesCap, and at most half the NATS server's max payload
	// (checked once connected): the job's status record carries the job
	// and more.
	MaxTaskBytes service.ByteSize `env:"MAX_TASK_BYTES" envDefault:"256KiB"`
	// MaxConcurrentWebhooks is how many webhook deliveries hold a body at
	// once (see api.WebhookLimits).
	MaxConcurrentWebhooks int `env:"MAX_CONCURRENT_WEBHOOKS" envDefault:"64"`
	// DedupeTTL is how long a delivery's dedupe key is kept in KV dedupe:
	// the same event within it runs nothing, however long ago its status
	// record (ORCH_STATUS_TTL) expired.
	DedupeTTL time.Duration `env:"DEDUPE_TTL" envDefault:"720h"`
	// BodyTimeout is how long a webhook's body may take to arrive; zero
	// means api.BodyTimeoutDefault (tests shorten it).
	BodyTimeout time.Duration `env:"-"`
	// SlotWait is how long a webhook waits for a body slot; zero means
	// api.SlotWaitDefault (tests shorten it).
	SlotWait time.Duration `env:"-"`
	// PublicURL is the base URL of links to a job.
	PublicURL string `env:"PUBLIC_URL"`
	// PlaneURL is Plane's base URL (https://api.plane.so) and PlaneToken
	// (or the file PlaneTokenFile) an API key (X-Api-Key), the notifier's
	// write-back key will do: Plane's webhooks carry no item identifier,
	// so the gateway reads the project's identifier and the item's
	// sequence id to name a task WID-41 (see package planenames). Unset:
	// tasks are named by their items' ids.
	PlaneURL       string `env:"PLANE_URL"`
	PlaneToken     string `env:"PLANE_TOKEN"`
	PlaneTokenFile string `env:"PLANE_TOKEN_FILE"`

	// Listener, when set, is used instead of listening on HTTPAddr (tests).
	Listener net.Listener `env:"-"`
	// Now, when set, is the clock of the dashboard's logins and of the
	// throttle of failed attempts (tests move it).
	Now func() time.Time `env:"-"`
	// RecordAfter, when set, replaces queue.RecordAfter: how long a job
	// waits in JOBS before the gateway creates its record (tests keep
	// jobs without one).
	RecordAfter time.Duration `env:"-"`
}

// Bounds of ORCH_MAX_TASK_BYTES: a job's own fields and the cut markers
// need MaxTaskBytesMin; MaxTaskBytesCap keeps a job well under NATS's
// default max payload of 1 MiB.
const (
	MaxTaskBytesMin = 4 << 10
	MaxTaskBytesCap = 512 << 10
)

// APITokenMinLength is the shortest ORCH_API_TOKEN the gateway takes: a
// token anyone who can reach the webhooks may guess at must be long enough
// that guessing is hopeless, throttled or not.
const APITokenMinLength = 32

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
	if c.MaxTaskBytes < MaxTaskBytesMin || c.MaxTaskBytes > MaxTaskBytesCap {
		errs = append(errs, fmt.Errorf("ORCH_MAX_TASK_BYTES is %d bytes, want %d (4KiB) to %d (512KiB)",
			c.MaxTaskBytes, MaxTaskBytesMin, MaxTaskBytesCap))
	}
	if c.MaxConcurrentWebhooks < 1 {
		errs = append(errs, errors.New("ORCH_MAX_CONCURRENT_WEBHOOKS must be at least 1"))
	}
	if c.DedupeTTL <= 0 {
		errs = append(errs, errors.New("ORCH_DEDUPE_TTL must be positive"))
	}
	if n := len(c.APIToken); n > 0 && n < APITokenMinLength {
		errs = append(errs, fmt.Errorf("ORCH_API_TOKEN is %d characters, want at least %d (make one with `openssl rand -hex 32`), or leave it empty to turn the queue API and the dashboard off",
			n, APITokenMinLength))
	}
	if _, err := throttle.ParseProxies(c.TrustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("ORCH_TRUSTED_PROXIES: %w", err))
	}
	if c.PlaneToken != "" && c.PlaneTokenFile != "" {
		errs = append(errs, errors.New("ORCH_PLANE_TOKEN and ORCH_PLANE_TOKEN_FILE: set one, not both"))
	}
	// A token without the URL is left unused, as the notifier leaves it
	// (compose hands both services the same secret file).
	if c.PlaneURL != "" && c.PlaneToken == "" && c.PlaneTokenFile == "" {
		errs = append(errs, errors.New("ORCH_PLANE_URL needs ORCH_PLANE_TOKEN (or _FILE)"))
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
	if cfg.PlaneURL != "" && cfg.PlaneTokenFile != "" {
		if cfg.PlaneToken, err = service.ReadSecretFile("ORCH_PLANE_TOKEN_FILE", cfg.PlaneTokenFile); err != nil {
			return err
		}
	}
	var current atomic.Pointer[registry.Registry]
	current.Store(reg)

	sp, err := spool.Open(filepath.Join(cfg.DataDir, SpoolDirName))
	if err != nil {
		return err
	}
	ix := index.New()
	m := metrics.New(sp, ix.Counts)
	q := queue.New(sp, ix, m, queue.Config{MaxTaskBytes: int(cfg.MaxTaskBytes), RecordAfter: cfg.RecordAfter,
		SupersedeRunning: func(project string) bool {
			p, ok := current.Load().ByKey(project)
			return ok && p.Supersede == registry.SupersedeRunning
		}}, log.Named("queue"))
	proxies, _ := throttle.ParseProxies(cfg.TrustedProxies) // checked by Validate
	limit := throttle.New(throttle.Config{TrustedProxies: proxies, Log: log.Named("throttle"), Now: cfg.Now})
	budgetLoc, err := time.LoadLocation(cfg.BudgetTZ)
	if err != nil {
		return fmt.Errorf("ORCH_BUDGET_TZ: %w", err)
	}
	svc := jobs.New(jobs.Config{Queue: q, Index: ix, Registry: current.Load, Now: time.Now, BudgetLoc: budgetLoc, Log: log.Named("jobs")})
	srv := &api.Server{
		Jobs: svc, Queue: q, Metrics: m, Registry: current.Load,
		GiteaSecret: cfg.GiteaSecret, PlaneSecret: cfg.PlaneSecret, PlaneAgentSecret: cfg.PlaneAgentSecret, APIToken: cfg.APIToken,
		MaxBodyBytes: int64(cfg.MaxBodyBytes), Now: time.Now,
		Webhooks: api.WebhookLimits{MaxConcurrent: cfg.MaxConcurrentWebhooks, BodyTimeout: cfg.BodyTimeout, SlotWait: cfg.SlotWait}, Throttle: limit,
		PlaneNames: planenames.New(planenames.Config{
			URL: cfg.PlaneURL, Token: cfg.PlaneToken, Known: ix.PlaneTask, Log: log.Named("planenames"),
		}),
	}
	// Any gateway reads any runner's output from JOBS_LOGS.
	dashboard := ui.New(ui.Config{
		Jobs: svc, APIToken: cfg.APIToken, PublicURL: cfg.PublicURL, Throttle: limit, Now: cfg.Now, Log: log.Named("ui"),
	})
	// The two faces side by side, one request id and access log for both.
	routes := http.NewServeMux()
	routes.Handle(ui.Prefix, dashboard)
	routes.Handle(strings.TrimSuffix(ui.Prefix, "/"), http.RedirectHandler(ui.Prefix, http.StatusMovedPermanently))
	routes.Handle("/", srv.Handler())

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
	// NATS closes last: after the background, and after the supersedes
	// that follow the jobs' publishes (queue.Wait), which the spool's
	// drain makes too.
	var nc *nats.Conn
	defer func() {
		stopBG()
		wg.Wait()
		q.Wait()
		if nc != nil {
			nc.Close()
		}
	}()
	// fatal stops the gateway for a setting found wrong only once
	// connected.
	fatal := make(chan error, 1)

	wg.Go(func() {
		// The index and the dedupe copy read their buckets again on a
		// reconnect: their watches may have gone with a server.
		rc := service.NewReconnects()
		conn, js, kv, err := service.Connect(bg, cfg.Common, "gateway", rc, log)
		if err != nil {
			if bg.Err() == nil {
				fatal <- err // a refused login: waiting would not help
			}
			return // or bg ended before NATS answered
		}
		nc = conn
		st := status.New(kv)
		if err := checkMaxPayload(cfg.MaxTaskBytes, nc.MaxPayload()); err != nil {
			fatal <- err
			return
		}
		var dkv jetstream.KeyValue
		if service.Retry(bg, log, "ensuring bucket "+proto.BucketDedupe, func(ctx context.Context) (err error) {
			dkv, err = proto.EnsureBucket(ctx, js, cfg.Topology().DedupeBucket(cfg.DedupeTTL))
			return err
		}) != nil {
			return // bg ended
		}
		dd := queue.NewDedupe(dkv, cfg.DedupeTTL)
		wg.Go(func() { dd.Watch(bg, rc, log.Named("dedupe")) })
		wg.Go(func() { dd.Keep(bg, ix, cfg.StatusTTL, log.Named("dedupe")) })
		wg.Go(func() { ix.FollowJobs(bg, nc, rc, log.Named("index")) })
		wg.Go(func() { q.RecordWaiting(bg, log.Named("queue")) })
		q.Connect(nc, js, st, dd)
		svc.Connect(nc, js, st)
		// The dashboard's logins wait for their own bucket; the index
		// does not wait for it.
		wg.Go(func() {
			var sessions jetstream.KeyValue
			if service.Retry(bg, log, "ensuring bucket "+proto.BucketUISessions, func(ctx context.Context) (err error) {
				sessions, err = proto.EnsureBucket(ctx, js, cfg.Topology().UISessionsBucket())
				return err
			}) == nil {
				dashboard.Connect(sessions)
			}
		})
		log.Info("jetstream connected", zap.Int("spool_depth", sp.Depth()))
		ix.Watch(bg, kv, rc, log.Named("index"))
	})
	wg.Go(func() { q.Drain(bg, spool.RetryDelayDefault) })

	hup, stopHUP := service.NotifyHUP()
	defer stopHUP()
	wg.Go(func() { service.OnSignal(bg, hup, func() { reload(cfg.ProjectsFile, &current, m, log) }) })

	hs := service.NewServer(api.WithRequestID(log.Named("http"), routes), log.Named("http"))
	hs.RegisterOnShutdown(svc.Close) // followed logs must not hold up the shutdown
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }() // ends with Shutdown below, which waits for it
	log.Info("gateway listening", zap.String("addr", ln.Addr().String()), zap.Int("projects", len(reg.Projects())),
		zap.String("spool", sp.Dir()), zap.Int("spool_depth", sp.Depth()))

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serving http: %w", err)
	case runErr = <-fatal:
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
	return runErr
}

// checkMaxPayload refuses an ORCH_MAX_TASK_BYTES over half the NATS
// server's max payload: the job's status record carries the job with the
// record's own fields (an error, the agent's result), and a job copied to
// JOBS_DLQ gains headers.
func checkMaxPayload(maxTask service.ByteSize, maxPayload int64) error {
	if int64(maxTask) > maxPayload/2 {
		return fmt.Errorf("ORCH_MAX_TASK_BYTES (%d) is over half the NATS server's max_payload (%d): lower it to %d or less, or raise max_payload",
			maxTask, maxPayload, maxPayload/2)
	}
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
