// Command local runs all of orch on one machine for `make run`: an
// embedded JetStream server listening where ORCH_NATS_URL points, with its
// store under ORCH_DATA_DIR and every write fsynced before it is acked,
// and the gateway, a runner and the notifier in one process. Every ORCH_
// variable is honoured; Ctrl-C stops everything.
package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto/embedded"
	"github.com/orch-dev/orch/proto/service"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
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
	service.Main(log, func(ctx context.Context) error { return run(ctx, gw, rn, nt, log) })
}

func run(ctx context.Context, gw gateway.Config, rn runner.Config, nt notifier.Config, log *zap.Logger) error {
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
