package notifier

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/scrub"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/writeback"
)

// Writeback is the configuration of the tracker write-back: a tracking
// comment per job on the Gitea pull request or Plane work item it came
// from, and a Gitea commit status. Each tracker is written to only where
// its URL and token are both set.
type Writeback struct {
	// ProjectsFile is the project registry (gitea_repo, plane_project,
	// plane_workspace, writeback). Needed once a tracker is set up;
	// SIGHUP reloads it.
	ProjectsFile string `env:"PROJECTS_FILE" envDefault:"projects.yaml"`
	// GiteaURL is Gitea's base URL as a person types it; orch adds
	// /api/v1. GiteaToken (or the file GiteaTokenFile) is an access token
	// of the agent's account.
	GiteaURL       string `env:"GITEA_URL"`
	GiteaToken     string `env:"GITEA_TOKEN"`
	GiteaTokenFile string `env:"GITEA_TOKEN_FILE"`
	// PlaneURL is Plane's API base URL, e.g. https://api.plane.so;
	// PlaneToken (or PlaneTokenFile) an API key sent as X-API-Key.
	PlaneURL       string `env:"PLANE_URL"`
	PlaneToken     string `env:"PLANE_TOKEN"`
	PlaneTokenFile string `env:"PLANE_TOKEN_FILE"`
	// PlaneAgentToken (or PlaneAgentTokenFile) is the bot token of the
	// Plane agent app (Authorization: Bearer), which posts the activities
	// of the agent runs of projects with plane_agent_app. Needs PlaneURL.
	PlaneAgentToken     string `env:"PLANE_AGENT_TOKEN"`
	PlaneAgentTokenFile string `env:"PLANE_AGENT_TOKEN_FILE"`
	// QueuedAfter is how long a job may wait in the queue before its
	// comment is created; 0 comments as soon as a job is queued.
	QueuedAfter time.Duration `env:"WRITEBACK_QUEUED_AFTER" envDefault:"1m"`
}

// validate reads the token files and checks that each URL has its token.
func (w *Writeback) validate() error {
	for _, t := range []struct {
		name       string
		url, token *string
		file       string
	}{
		{"GITEA", &w.GiteaURL, &w.GiteaToken, w.GiteaTokenFile},
		{"PLANE", &w.PlaneURL, &w.PlaneToken, w.PlaneTokenFile},
	} {
		if t.file != "" {
			data, err := os.ReadFile(t.file)
			if err != nil {
				// The error names the file, never its content.
				return fmt.Errorf("ORCH_%s_TOKEN_FILE: %w", t.name, err)
			}
			*t.token = strings.TrimSpace(string(data))
		}
		if (*t.url == "") != (*t.token == "") {
			return fmt.Errorf("ORCH_%s_URL and ORCH_%s_TOKEN (or _FILE) go together", t.name, t.name)
		}
	}
	if w.PlaneAgentTokenFile != "" {
		data, err := os.ReadFile(w.PlaneAgentTokenFile)
		if err != nil {
			return fmt.Errorf("ORCH_PLANE_AGENT_TOKEN_FILE: %w", err)
		}
		w.PlaneAgentToken = strings.TrimSpace(string(data))
	}
	if w.PlaneAgentToken != "" && w.PlaneURL == "" {
		return errors.New("ORCH_PLANE_AGENT_TOKEN (or _FILE) needs ORCH_PLANE_URL")
	}
	if w.QueuedAfter < 0 {
		return errors.New("ORCH_WRITEBACK_QUEUED_AFTER must not be negative")
	}
	return nil
}

// enabled reports whether any tracker is set up.
func (w *Writeback) enabled() bool { return w.GiteaURL != "" || w.PlaneURL != "" }

// startWriteback starts the tracker write-back, if a tracker is set up,
// owned by wg until ctx ends.
func (n *Notifier) startWriteback(ctx context.Context, wg *sync.WaitGroup, js jetstream.JetStream, kv jetstream.KeyValue, log *zap.Logger) error {
	c := n.cfg.Writeback
	if !c.enabled() {
		// A SIGHUP (systemd's reload) must not end the notifier even
		// with no registry to reload.
		var none registryHolder
		hup, stop := service.NotifyHUP()
		log.Info("no ORCH_GITEA_URL or ORCH_PLANE_URL: no tracker write-back")
		wg.Go(func() { none.reloadOnHUP(ctx, hup, stop, "", log) })
		return nil
	}
	reg, err := registry.Load(c.ProjectsFile)
	if err != nil {
		return err
	}
	current := &registryHolder{reg: reg}
	hc := &http.Client{Timeout: writeback.TimeoutDefault}
	cfg := writeback.Config{
		Registry: current.get, PublicURL: n.cfg.PublicURL, QueuedAfter: c.QueuedAfter,
		Scrubber: scrub.Scrubber{Secrets: []string{c.GiteaToken, c.PlaneToken, c.PlaneAgentToken, n.cfg.TelegramBotToken}},
		LogTail:  func(ctx context.Context, st *proto.Status) string { return n.logTail(ctx, log, st) },
		Recorder: n.metrics,
	}
	if c.GiteaURL != "" {
		cfg.Gitea = writeback.NewGitea(c.GiteaURL, c.GiteaToken, hc)
	}
	if c.PlaneURL != "" {
		cfg.Plane = writeback.NewPlane(c.PlaneURL, c.PlaneToken, hc)
	}
	if c.PlaneAgentToken != "" {
		cfg.PlaneRuns = writeback.NewPlaneRuns(c.PlaneURL, c.PlaneAgentToken, hc)
	}
	w, err := writeback.New(ctx, js, kv, n.cfg.Topology(), cfg, log.Named("writeback"))
	if err != nil {
		return err
	}
	n.metrics.writeback.Store(w)
	wg.Go(func() { w.Run(ctx) })
	hup, stop := service.NotifyHUP()
	wg.Go(func() { current.reloadOnHUP(ctx, hup, stop, c.ProjectsFile, log) })
	return nil
}
