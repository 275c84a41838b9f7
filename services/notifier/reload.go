package notifier

import (
	"context"
	"os"
	"sync"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/service"
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

// reloadOnHUP reloads the registry on every signal on hup (from
// service.NotifyHUP, whose stop it calls when it returns) until ctx ends.
// A file that does not load leaves the old registry in place; with no path
// there is nothing to reload, and the signal is only logged.
func (h *registryHolder) reloadOnHUP(ctx context.Context, hup <-chan os.Signal, stop func(), path string, log *zap.Logger) {
	defer stop()
	service.OnSignal(ctx, hup, func() {
		if path == "" {
			log.Info("SIGHUP: no tracker write-back, nothing to reload")
			return
		}
		reg, err := registry.Load(path)
		if err != nil {
			log.Error("reloading the project registry failed, keeping the old one", zap.Error(err))
			return
		}
		h.mu.Lock()
		h.reg = reg
		h.mu.Unlock()
		log.Info("project registry reloaded", zap.String("file", path), zap.Int("projects", len(reg.Projects())))
	})
}
