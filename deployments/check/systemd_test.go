package check

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/orch-dev/orch/kit/service"
)

var systemdDir = filepath.Join(repoRoot, "deployments", "systemd")

// systemdDirectives are the directives these units may use, per section:
// the unit parser accepts any name, so a misspelt hardening option would
// otherwise be ignored by systemd with only a log line.
var systemdDirectives = map[string][]string{
	"Unit":    {"Description", "Documentation", "Wants", "Requires", "After", "Before", "PartOf"},
	"Install": {"WantedBy", "RequiredBy", "Also"},
	"Service": {
		"Type", "User", "Group", "SupplementaryGroups", "EnvironmentFile", "Environment", "ExecStart", "ExecReload", "Restart", "RestartSec",
		"TimeoutStopSec", "KillMode", "KillSignal", "LimitNOFILE",
		"StateDirectory", "StateDirectoryMode", "ReadWritePaths", "UMask",
		"NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
		"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
		"ProtectClock", "ProtectHostname", "ProtectProc", "RestrictAddressFamilies", "RestrictNamespaces",
		"RestrictRealtime", "RestrictSUIDSGID", "LockPersonality", "MemoryDenyWriteExecute",
		"SystemCallArchitectures", "SystemCallFilter", "SystemCallErrorNumber", "CapabilityBoundingSet",
		"AmbientCapabilities",
	},
}

// systemdUnit is a parsed unit file.
type systemdUnit struct {
	path string
	opts []*unit.UnitOption
}

func (u *systemdUnit) values(section, name string) []string {
	var vs []string
	for _, o := range u.opts {
		if o.Section == section && o.Name == name {
			vs = append(vs, o.Value)
		}
	}
	return vs
}

// value is the last setting of a directive, the one systemd uses.
func (u *systemdUnit) value(section, name string) string {
	vs := u.values(section, name)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

func loadUnits(t *testing.T) []*systemdUnit {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no units in %s (%v)", systemdDir, err)
	}
	var units []*systemdUnit
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		opts, err := unit.DeserializeOptions(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		units = append(units, &systemdUnit{path: p, opts: opts})
	}
	return units
}

// orchUnitService maps orch-<service>.service to its service.
func orchUnitService(path string) string {
	name := strings.TrimSuffix(filepath.Base(path), ".service")
	if s, ok := strings.CutPrefix(name, "orch-"); ok {
		return s
	}
	return ""
}

// unitEnv is the environment systemd gives a unit: Environment= lines,
// overridden by the EnvironmentFile= files (/etc/orch/X is shipped as
// deployments/systemd/env/X).
func unitEnv(t *testing.T, u *systemdUnit) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, line := range u.values("Service", "Environment") {
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	for _, f := range u.values("Service", "EnvironmentFile") {
		optional := strings.HasPrefix(f, "-")
		f = strings.TrimPrefix(f, "-")
		rel, ok := strings.CutPrefix(f, "/etc/orch/")
		if !ok {
			t.Errorf("%s: EnvironmentFile %s is not under /etc/orch", u.path, f)
			continue
		}
		vars, err := readEnvFile(filepath.Join(systemdDir, "env", rel))
		if err != nil {
			if !optional {
				t.Errorf("%s: EnvironmentFile %s has no sample: %v", u.path, f, err)
			}
			continue
		}
		for k, v := range vars {
			env[k] = v
		}
	}
	return env
}

// unitCommentedVars are the "#ORCH_X=value" lines of a unit's
// EnvironmentFile= samples: settings offered to uncomment.
func unitCommentedVars(t *testing.T, u *systemdUnit) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, f := range u.values("Service", "EnvironmentFile") {
		rel, ok := strings.CutPrefix(strings.TrimPrefix(f, "-"), "/etc/orch/")
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(systemdDir, "env", rel))
		if err != nil {
			continue // unitEnv reports it
		}
		for _, line := range strings.Split(string(data), "\n") {
			line, ok := strings.CutPrefix(strings.TrimSpace(line), "#")
			if k, v, ok2 := strings.Cut(line, "="); ok && ok2 && strings.HasPrefix(k, service.EnvPrefix) {
				vars[k] = v
			}
		}
	}
	return vars
}

func systemdEnvs(t *testing.T) []deploymentEnv {
	t.Helper()
	var envs []deploymentEnv
	for _, u := range loadUnits(t) {
		if s := orchUnitService(u.path); s != "" {
			envs = append(envs, deploymentEnv{where: "systemd/" + filepath.Base(u.path), service: s, env: unitEnv(t, u), commented: unitCommentedVars(t, u)})
		}
	}
	return envs
}

func TestSystemdUnits(t *testing.T) {
	sysusers, err := os.ReadFile(filepath.Join(systemdDir, "orch.sysusers.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, u := range loadUnits(t) {
		name := filepath.Base(u.path)
		for _, o := range u.opts {
			if !slices.Contains(systemdDirectives[o.Section], o.Name) {
				t.Errorf("%s: [%s] %s is not a directive these units expect (misspelt?)", name, o.Section, o.Name)
			}
		}
		exec := u.value("Service", "ExecStart")
		if !filepath.IsAbs(strings.Fields(exec + " x")[0]) {
			t.Errorf("%s: ExecStart %q is not an absolute path", name, exec)
		}
		if u.value("Install", "WantedBy") == "" {
			t.Errorf("%s: no WantedBy", name)
		}

		// A dedicated user, declared in the sysusers file.
		user := u.value("Service", "User")
		if user == "" || user == "root" {
			t.Errorf("%s: User=%q, want a dedicated user", name, user)
		} else if !strings.Contains(string(sysusers), "\nu "+user+" ") {
			t.Errorf("%s: user %s is not declared in orch.sysusers.conf", name, user)
		}
		// Hardening every unit has.
		for directive, want := range map[string]string{
			"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes",
			"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
			"RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "",
		} {
			if got := u.values("Service", directive); len(got) == 0 || got[len(got)-1] != want {
				t.Errorf("%s: %s=%v, want %q", name, directive, got, want)
			}
		}
		// ProtectSystem=strict makes everything read-only: what the
		// service writes is its state directory, listed in ReadWritePaths.
		state := u.value("Service", "StateDirectory")
		rw := u.value("Service", "ReadWritePaths")
		if state == "" || rw != "/var/lib/"+strings.Fields(state)[0] {
			t.Errorf("%s: ReadWritePaths=%q, want the StateDirectory /var/lib/%s", name, rw, state)
		}

		svc := orchUnitService(u.path)
		if svc == "" {
			continue
		}
		services = append(services, svc)
		env := unitEnv(t, u)
		if len(u.values("Service", "EnvironmentFile")) == 0 {
			t.Errorf("%s: no EnvironmentFile", name)
		}
		if dd := env["ORCH_DATA_DIR"]; dd == "" || !strings.HasPrefix(dd+"/", rw+"/") {
			t.Errorf("%s: ORCH_DATA_DIR=%q is not under ReadWritePaths %s", name, dd, rw)
		}
		if svc == "runner" {
			// SIGTERM to the runner alone, and time to use its grace.
			if km := u.value("Service", "KillMode"); km != "mixed" {
				t.Errorf("%s: KillMode=%q, want mixed (SIGTERM to the runner, not to its agents)", name, km)
			}
			need := runnerStopTime(t, env)
			stop, err := time.ParseDuration(u.value("Service", "TimeoutStopSec"))
			if err != nil || stop <= need {
				t.Errorf("%s: TimeoutStopSec %s not above the runner's stop time %v (%v)", name, u.value("Service", "TimeoutStopSec"), need, err)
			}
		}
	}
	slices.Sort(services)
	if !slices.Equal(services, []string{"gateway", "notifier", "runner"}) {
		t.Errorf("orch units for %v, want gateway, notifier and runner", services)
	}
}
