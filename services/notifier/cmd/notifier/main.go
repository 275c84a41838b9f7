// Command notifier alerts on Telegram when a job has failed for good.
package main

import (
	"context"
	"os"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/notifier"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "dev"

func main() {
	service.HandleFlags("notifier", version)
	var cfg notifier.Config
	if err := service.FromEnv(&cfg); err != nil {
		service.Fatal(err)
	}
	log, err := service.NewLogger(cfg.Common, "notifier")
	if err != nil {
		service.Fatal(err)
	}
	if _, set := os.LookupEnv(service.EnvPrefix + "METRICS_ADDR"); set {
		log.Warn("ORCH_METRICS_ADDR is no longer read: /metrics is served on ORCH_HTTP_ADDR", zap.String("http_addr", cfg.HTTPAddr))
	}
	service.Main(log, func(ctx context.Context) error { return notifier.Run(ctx, cfg, log) })
}
