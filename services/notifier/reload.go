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

// reloadOnHUP reloads the registry on every SIGHUP until ctx ends. A file
// that does not load leaves the old registry in place.
func (h *registryHolder) reloadOnHUP(ctx context.Context, path string, log *zap.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
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
