package check

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/orch-dev/orch/kit/registry"
)

// TestSampleRegistries loads the sample project registries that compose
// and Kubernetes mount, with the services' own loader.
func TestSampleRegistries(t *testing.T) {
	if _, err := registry.Load(filepath.Join(composeDir, "projects.yaml")); err != nil {
		t.Errorf("compose: %v", err)
	}
	cm := loadK8s(t).configMap("orch-projects")
	if cm == nil {
		t.Fatal("no ConfigMap orch-projects")
	}
	path := filepath.Join(t.TempDir(), "projects.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["projects.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Load(path); err != nil {
		t.Errorf("k8s ConfigMap orch-projects: %v", err)
	}
}
