package check

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
)

// repoRoot is the repository, two levels above this module.
const repoRoot = "../.."

// orchService is one of the three services, as the deployment files see
// it: the variables its Config reads, and its own validation.
type orchService struct {
	name string
	// config is a pointer to a zero Config of the service.
	config func() any
	// check parses env as the service would and runs its validation.
	check func(env map[string]string) error
	// required names the variables a deployment must set for it.
	required []string
}

var orchServices = []orchService{
	{
		name:     "gateway",
		config:   func() any { return &gateway.Config{} },
		check:    checkConfig[gateway.Config],
		required: []string{"ORCH_GITEA_SECRET", "ORCH_PLANE_SECRET"},
	},
	{
		name:   "runner",
		config: func() any { return &runner.Config{} },
		check:  checkConfig[runner.Config],
	},
	{
		name:   "notifier",
		config: func() any { return &notifier.Config{} },
		check:  checkConfig[notifier.Config],
	},
}

// parseEnv reads cfg from environ as the service reads its environment.
func parseEnv(cfg any, environ map[string]string) error { return service.Parse(cfg, environ) }

// checkConfig reads a service's Config C from environ as the service
// does, fills in its defaults and validates it.
func checkConfig[C any, P interface {
	*C
	SetDefaults()
	Validate() error
}](environ map[string]string) error {
	c := P(new(C))
	if err := parseEnv(c, environ); err != nil {
		return err
	}
	c.SetDefaults()
	return c.Validate()
}

func serviceNamed(t *testing.T, name string) orchService {
	t.Helper()
	for _, s := range orchServices {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no service %q", name)
	return orchService{}
}

// configVars lists the ORCH_ variables a Config struct reads, embedded
// structs (service.Common) included.
func configVars(cfg any) []string { return slices.Sorted(maps.Keys(configDefaults(cfg))) }

// knownVars maps every ORCH_ variable to the services that read it.
func knownVars() map[string][]string {
	known := map[string][]string{}
	for _, s := range orchServices {
		for _, v := range configVars(s.config()) {
			known[v] = append(known[v], s.name)
		}
	}
	return known
}

// deploymentEnv is the environment one deployment file gives one service.
type deploymentEnv struct {
	where   string // file and unit, for messages
	service string // gateway, runner or notifier
	env     map[string]string
	// files are the files the deployment puts into the service's file
	// system, by path there (compose bind mounts and secrets, Kubernetes
	// ConfigMap and Secret volumes). Empty for systemd: the host's files.
	files map[string]deployedFile
	// commented are the ORCH_ settings offered as commented-out lines
	// (systemd's env files), to uncomment where they are wanted.
	commented map[string]string
}

// deployedFile is a file a deployment gives a service.
type deployedFile struct {
	// origin names where it comes from, the same for two services that
	// get the same file (e.g. "ConfigMap orch-projects key projects.yaml").
	origin string
	// secret says it comes from a Secret (compose secrets, a Kubernetes
	// Secret volume), not a file anyone with the manifests can read.
	secret  bool
	content string
}

// checkableEnv returns d.env with every ORCH_..._FILE variable that names
// a file the deployment supplies pointed at a copy of that file, so that
// the service's validation can read it here. When fill is set, a secret
// that is empty in the deployment (a placeholder) reads as "placeholder".
func (d deploymentEnv) checkableEnv(t *testing.T, fill bool) map[string]string {
	t.Helper()
	env := maps.Clone(d.env)
	for k, v := range env {
		f, ok := d.files[v]
		if !ok || !strings.HasPrefix(k, service.EnvPrefix) || !strings.HasSuffix(k, "_FILE") {
			continue
		}
		content := f.content
		if fill && f.secret && strings.TrimSpace(content) == "" {
			content = "placeholder"
		}
		copyPath := filepath.Join(t.TempDir(), filepath.Base(v))
		if err := os.WriteFile(copyPath, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		env[k] = copyPath
	}
	return env
}

func TestConfigVarsAreFound(t *testing.T) {
	// The reflection must see the embedded Common and each service's own
	// fields, or every check below passes vacuously.
	known := knownVars()
	for _, v := range []string{"ORCH_NATS_URL", "ORCH_STREAM_REPLICAS", "ORCH_GITEA_SECRET", "ORCH_SHUTDOWN_GRACE", "ORCH_TELEGRAM_BOT_TOKEN"} {
		if _, ok := known[v]; !ok {
			t.Errorf("%s not found in any Config: %v", v, slices.Sorted(maps.Keys(known)))
		}
	}
}

// TestDeploymentVars cross-checks the variables compose, Kubernetes and
// systemd set against the services' Config structs: each ORCH_ variable
// set for a service is one that service reads, the required ones are set,
// and the service's own validation accepts the result.
func TestDeploymentVars(t *testing.T) {
	known := knownVars()
	var all []deploymentEnv
	all = append(all, composeEnvs(t)...)
	all = append(all, kubernetesEnvs(t)...)
	all = append(all, systemdEnvs(t)...)

	seen := map[string]map[string]bool{} // service -> deployment kinds
	for _, d := range all {
		svc := serviceNamed(t, d.service)
		kind := strings.SplitN(d.where, "/", 2)[0]
		if seen[d.service] == nil {
			seen[d.service] = map[string]bool{}
		}
		seen[d.service][kind] = true
		for name := range d.env {
			if !strings.HasPrefix(name, service.EnvPrefix) {
				continue
			}
			readers, ok := known[name]
			if !ok {
				t.Errorf("%s sets %s, which no service reads", d.where, name)
				continue
			}
			if !slices.Contains(readers, d.service) {
				t.Errorf("%s sets %s for the %s, but only %v read it", d.where, name, d.service, readers)
			}
		}
		for _, name := range svc.required {
			if d.env[name] == "" {
				t.Errorf("%s does not set %s, which the %s requires", d.where, name, d.service)
			}
		}
		if err := svc.check(d.checkableEnv(t, false)); err != nil {
			t.Errorf("%s: the %s rejects its configuration: %v", d.where, d.service, err)
		}
	}
	for _, s := range orchServices {
		for _, kind := range []string{"compose", "k8s", "systemd"} {
			if !seen[s.name][kind] {
				t.Errorf("no %s deployment of the %s found", kind, s.name)
			}
		}
	}
}

// TestDeploymentFilesNameKnownVars scans every compose, Kubernetes and
// systemd file, comments included, for ORCH_ names: a misspelt variable in
// a comment misleads an operator as much as one in a setting.
func TestDeploymentFilesNameKnownVars(t *testing.T) {
	known := knownVars()
	word := regexp.MustCompile(`ORCH_[A-Z0-9_]+`)
	for _, dir := range []string{"compose", "k8s", "systemd"} {
		root := filepath.Join(repoRoot, "deployments", dir)
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, name := range word.FindAllString(string(data), -1) {
				if _, ok := known[name]; !ok {
					t.Errorf("%s names %s, which no service reads", path, name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestEnvExampleListsEveryVar checks that .env.example, the list an
// operator starts from, names every variable of every service.
func TestEnvExampleListsEveryVar(t *testing.T) {
	path := filepath.Join(repoRoot, "deployments", "compose", ".env.example")
	example, err := readEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name := range knownVars() {
		if _, ok := example[name]; !ok {
			t.Errorf("%s does not list %s", path, name)
		}
	}
}

// readEnvFile reads KEY=value lines, as compose's .env and systemd's
// EnvironmentFile= take them (no quotes are used in these files).
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(k, " \t\"'") {
			return nil, fmt.Errorf("%s:%d: want KEY=value, got %q", path, n, line)
		}
		if strings.HasPrefix(v, `"`) || strings.HasPrefix(v, "'") {
			return nil, fmt.Errorf("%s:%d: quoted values read differently in compose and systemd: %q", path, n, line)
		}
		vars[k] = v
	}
	return vars, sc.Err()
}

// runnerStopTime is how long a runner configured by environ may take to
// stop after SIGTERM: the grace period of its running agents, then the
// kill grace between an agent's SIGTERM and SIGKILL. The platform
// (Docker, the kubelet, systemd) must wait longer before it kills the
// runner, or jobs are not handed back.
func runnerStopTime(t *testing.T, environ map[string]string) time.Duration {
	t.Helper()
	// The NATS login (a password file only the deployment has) has no
	// say in the stop time.
	environ = maps.Clone(environ)
	maps.DeleteFunc(environ, func(k, _ string) bool {
		return strings.HasPrefix(k, service.EnvPrefix+"NATS_") && k != service.EnvPrefix+"NATS_URL"
	})
	var c runner.Config
	if err := parseEnv(&c, environ); err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	stop := c.ShutdownGrace
	// Looked up by name: the kill grace (ORCH_AGENT_KILL_GRACE) is newer
	// than this check, which must not break where it is absent.
	if f := reflect.ValueOf(c).FieldByName("KillGrace"); f.IsValid() && f.Kind() == reflect.Int64 {
		stop += time.Duration(f.Int())
	}
	return stop
}
