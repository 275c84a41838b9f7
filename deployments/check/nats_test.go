package check

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

var natsDir = filepath.Join(repoRoot, "deployments", "nats")

// TestNATSConfigs parses every NATS config with nats-server's own parser,
// which rejects unknown fields, and checks that the compose cluster's
// nodes form one JetStream cluster.
func TestNATSConfigs(t *testing.T) {
	setPasswordVars(t) // users.conf reads them
	paths, err := filepath.Glob(filepath.Join(natsDir, "*.conf"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no configs in %s (%v)", natsDir, err)
	}
	var names []string
	for _, p := range paths {
		if filepath.Base(p) == "users.conf" {
			continue // included by the others (nats_auth_test.go)
		}
		opts, err := server.ProcessConfigFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		base := filepath.Base(p)
		if !opts.JetStream || opts.StoreDir == "" {
			t.Errorf("%s: JetStream %v with store %q, want enabled on a file store", base, opts.JetStream, opts.StoreDir)
		}
		if opts.HTTPPort == 0 {
			t.Errorf("%s: no monitoring port (health checks ask /healthz)", base)
		}
		if !strings.HasPrefix(base, "nats-") {
			continue
		}
		// A node of the compose cluster.
		names = append(names, opts.ServerName)
		if opts.Cluster.Name != "orch" || opts.Cluster.Port != 6222 {
			t.Errorf("%s: cluster %q on port %d, want orch on 6222", base, opts.Cluster.Name, opts.Cluster.Port)
		}
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		if !slices.Equal(routes, []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}) {
			t.Errorf("%s: routes %v, want all three nodes", base, routes)
		}
		if want := strings.TrimSuffix(base, ".conf"); opts.ServerName != want {
			t.Errorf("%s: server_name %q, want %q (the compose service name)", base, opts.ServerName, want)
		}
	}
	if len(names) != 3 || len(slices.Compact(slices.Sorted(slices.Values(names)))) != 3 {
		t.Errorf("compose cluster nodes %v, want three distinct names", names)
	}
}
