// Command gateway receives Gitea and Plane webhooks and queues jobs.
package main

import (
	"context"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/gateway"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "dev"

func main() {
	service.HandleFlags("gateway", version)
	var cfg gateway.Config
	if err := service.FromEnv(&cfg); err != nil {
		service.Fatal(err)
	}
	log, err := service.NewLogger(cfg.Common, "gateway")
	if err != nil {
		service.Fatal(err)
	}
	service.Main(log, func(ctx context.Context) error { return gateway.Run(ctx, cfg, log) })
}
