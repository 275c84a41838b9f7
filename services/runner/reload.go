package runner

import (
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/services/runner/prompt"
)

// projects is one version of the project registry and the task templates
// it names. They are loaded and swapped together, and a job takes one
// version when it starts and keeps it to its end, so a reload never gives
// a job in flight a project and templates from different files.
type projects struct {
	reg   *registry.Registry
	tmpls *prompt.Templates
}

// loadProjects reads the registry at path and the templates it names.
// Its errors name the file and, for the registry, the line.
func loadProjects(path string) (*projects, error) {
	reg, err := registry.Load(path)
	if err != nil {
		return nil, err
	}
	tmpls, err := prompt.Load(reg)
	if err != nil {
		return nil, err
	}
	return &projects{reg: reg, tmpls: tmpls}, nil
}

// reload reloads the registry and its templates (on SIGHUP). A file or
// template that does not load leaves the old version in place, so a typo
// never stops a running runner.
func (r *Runner) reload() {
	p, err := loadProjects(r.cfg.ProjectsFile)
	if err != nil {
		r.log.Error("reloading the project registry failed, keeping the old one", zap.String("file", r.cfg.ProjectsFile), zap.Error(err))
		return
	}
	r.projects.Store(p)
	// A raised budget may end holds: look at them now.
	select {
	case r.pokeRelease <- struct{}{}:
	default:
	}
	r.log.Info("project registry reloaded", zap.String("file", r.cfg.ProjectsFile), zap.Int("projects", len(p.reg.Projects())))
}
