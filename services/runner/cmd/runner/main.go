// Command runner pulls jobs from JetStream and runs an agent for each.
package main

import (
	"context"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/runner"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "dev"

func main() {
	service.HandleFlags("runner", version)
	var cfg runner.Config
	if err := service.FromEnv(&cfg); err != nil {
		service.Fatal(err)
	}
	log, err := service.NewLogger(cfg.Common, "runner")
	if err != nil {
		service.Fatal(err)
	}
	service.Main(log, func(ctx context.Context) error { return runner.Run(ctx, cfg, log) })
}
