// Command notifier alerts on Telegram when a job has failed for good.
package main

import (
	"context"

	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/services/notifier"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "dev"

func main() {
	service.HandleVersion("notifier", version)
	var cfg notifier.Config
	if err := service.FromEnv(&cfg); err != nil {
		service.Fatal(err)
	}
	log, err := service.NewLogger(cfg.Common, "notifier")
	if err != nil {
		service.Fatal(err)
	}
	service.Main(log, func(ctx context.Context) error { return notifier.Run(ctx, cfg, log) })
}
