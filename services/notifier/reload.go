package notifier

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto/registry"
)

// registryHolder is the current project registry, replaced on SIGHUP.
type registryHolder struct {
	mu  sync.RWMutex
	reg *registry.Registry
}

func (h *registryHolder) get() *registry.Registry {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.reg
}

// notifyHUP starts catching SIGHUP, so that it no longer ends the process;
// reloadOnHUP stops catching it when it returns.
func notifyHUP() chan os.Signal {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup
}

// reloadOnHUP reloads the registry on every SIGHUP until ctx ends. A file
// that does not load leaves the old registry in place; with no path there
// is nothing to reload, and the signal is only logged.
func (h *registryHolder) reloadOnHUP(ctx context.Context, hup chan os.Signal, path string, log *zap.Logger) {
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if path == "" {
			log.Info("SIGHUP: no tracker write-back, nothing to reload")
			continue
		}
		reg, err := registry.Load(path)
		if err != nil {
			log.Error("reloading the project registry failed, keeping the old one", zap.Error(err))
			continue
		}
		h.mu.Lock()
		h.reg = reg
		h.mu.Unlock()
		log.Info("project registry reloaded", zap.String("file", path), zap.Int("projects", len(reg.Projects())))
	}
}
