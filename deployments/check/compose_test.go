package check

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/orch-dev/orch/kit/service"
)

var composeDir = filepath.Join(repoRoot, "deployments", "compose")

// loadCompose loads compose.yaml with compose-spec's own loader (the one
// docker compose uses: schema validation, interpolation, merge keys),
// interpolating from envFile as `docker compose --env-file` would.
func loadCompose(t *testing.T, envFile string) (*types.Project, error) {
	t.Helper()
	dir, err := filepath.Abs(composeDir)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yaml")},
		cli.WithWorkingDirectory(dir),
		cli.WithEnvFiles(envFile),
		cli.WithDotEnv,
	)
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

func loadComposeExample(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadCompose(t, filepath.Join(composeDir, ".env.example"))
	if err != nil {
		t.Fatalf("loading compose.yaml with .env.example: %v", err)
	}
	return p
}

// composeKinds maps the compose services to orch services.
func composeKind(name string) string {
	switch {
	case name == "gateway", name == "notifier":
		return name
	case strings.HasPrefix(name, "runner-"):
		return "runner"
	}
	return ""
}

func composeEnvs(t *testing.T) []deploymentEnv {
	t.Helper()
	p := loadComposeExample(t)
	var envs []deploymentEnv
	for name, svc := range p.Services {
		kind := composeKind(name)
		if kind == "" {
			continue
		}
		env := map[string]string{}
		for k, v := range svc.Environment {
			if v != nil {
				env[k] = *v
			}
		}
		envs = append(envs, deploymentEnv{where: "compose/compose.yaml " + name, service: kind, env: env, files: composeFiles(t, p, svc)})
	}
	return envs
}

// composeFiles lists the files compose puts into a service's container:
// bind-mounted files and secrets (at /run/secrets/<name> unless a target
// is given).
func composeFiles(t *testing.T, p *types.Project, svc types.ServiceConfig) map[string]deployedFile {
	t.Helper()
	files := map[string]deployedFile{}
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if data, err := os.ReadFile(v.Source); err == nil {
			files[v.Target] = deployedFile{origin: "bind mount of " + v.Source, content: string(data)}
		}
	}
	for _, ref := range svc.Secrets {
		target := ref.Target
		if target == "" {
			target = ref.Source
		}
		if !filepath.IsAbs(target) {
			target = "/run/secrets/" + target
		}
		sec, ok := p.Secrets[ref.Source]
		if !ok {
			t.Errorf("compose: %s uses undeclared secret %s", svc.Name, ref.Source)
			continue
		}
		content := sec.Content
		if sec.File != "" {
			data, err := os.ReadFile(sec.File)
			if err != nil {
				t.Errorf("compose: secret %s: %v", ref.Source, err)
			}
			content = string(data)
		}
		files[target] = deployedFile{origin: "secret " + ref.Source, secret: true, content: content}
	}
	return files
}

func TestComposeLoads(t *testing.T) {
	p := loadComposeExample(t)

	var nats, runners []string
	for name := range p.Services {
		switch {
		case strings.HasPrefix(name, "nats-"):
			nats = append(nats, name)
		case strings.HasPrefix(name, "runner-"):
			runners = append(runners, name)
		}
	}
	if len(nats) != 3 {
		t.Errorf("NATS nodes %v, want 3", nats)
	}
	if len(runners) != 2 {
		t.Errorf("runners %v, want 2", runners)
	}
	for _, want := range []string{"gateway", "notifier"} {
		if _, ok := p.Services[want]; !ok {
			t.Errorf("no %s service", want)
		}
	}

	volumeTargets := map[string]bool{}
	for name, svc := range p.Services {
		// Every NATS node and orch service answers a health check; the
		// services wait for healthy NATS nodes.
		if strings.HasPrefix(name, "nats-") && svc.StopSignal != "SIGUSR2" {
			t.Errorf("%s: stop_signal %q, want SIGUSR2 (lame duck mode)", name, svc.StopSignal)
		}
		if strings.HasPrefix(name, "nats-") || composeKind(name) != "" {
			if svc.HealthCheck == nil || len(svc.HealthCheck.Test) == 0 || svc.HealthCheck.Disable {
				t.Errorf("%s has no health check", name)
			}
		}
		if composeKind(name) != "" {
			for _, n := range nats {
				if dep, ok := svc.DependsOn[n]; !ok || dep.Condition != types.ServiceConditionHealthy {
					t.Errorf("%s does not wait for %s to be healthy", name, n)
				}
			}
			if svc.Build == nil {
				t.Errorf("%s has no build section", name)
			} else {
				df := filepath.Join(svc.Build.Context, svc.Build.Dockerfile)
				if _, err := os.Stat(df); err != nil {
					t.Errorf("%s builds from %s: %v", name, df, err)
				}
				if ctx, _ := filepath.Abs(repoRoot); svc.Build.Context != ctx {
					t.Errorf("%s builds in %s, want the repository root %s", name, svc.Build.Context, ctx)
				}
			}
		}
		for _, v := range svc.Volumes {
			switch v.Type {
			case types.VolumeTypeBind:
				// A missing source would be created by Docker as an empty
				// directory: the file must be in the repository.
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("%s mounts %s: %v", name, v.Source, err)
				}
			case types.VolumeTypeVolume:
				if volumeTargets[v.Source] {
					t.Errorf("volume %s is mounted by more than one service", v.Source)
				}
				volumeTargets[v.Source] = true
				if _, ok := p.Volumes[v.Source]; !ok {
					t.Errorf("%s mounts undeclared volume %s", name, v.Source)
				}
			}
		}
	}

	// The state that must outlive a container sits on named volumes: the
	// NATS stores, the gateway's spool and the runners' workspaces (both
	// under ORCH_DATA_DIR).
	for name, svc := range p.Services {
		var want string
		switch {
		case strings.HasPrefix(name, "nats-"):
			want = "/data"
		case composeKind(name) != "":
			want = *svc.Environment["ORCH_DATA_DIR"]
		default:
			continue
		}
		if !slices.ContainsFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeVolume && v.Target == want
		}) {
			t.Errorf("%s keeps %s on no named volume", name, want)
		}
	}

	// Runners: their own name and workspace each, and Docker waits longer
	// than the runner's grace period before it kills one.
	names := map[string]bool{}
	for _, name := range runners {
		svc := p.Services[name]
		rn := svc.Environment["ORCH_RUNNER_NAME"]
		if rn == nil || *rn == "" || names[*rn] {
			t.Errorf("%s: ORCH_RUNNER_NAME empty or shared", name)
		} else {
			names[*rn] = true
		}
		env := map[string]string{}
		for k, v := range svc.Environment {
			if v != nil {
				env[k] = *v
			}
		}
		if stop := runnerStopTime(t, env); svc.StopGracePeriod == nil || time.Duration(*svc.StopGracePeriod) <= stop {
			t.Errorf("%s: stop_grace_period %v not above the runner's stop time %v", name, svc.StopGracePeriod, stop)
		}
		ws := *svc.Environment["ORCH_WORKSPACE_DIR"]
		if !strings.HasPrefix(ws, *svc.Environment["ORCH_DATA_DIR"]+"/") {
			t.Errorf("%s: workspace %s is not on the data volume", name, ws)
		}
	}

	// All services name all three nodes and replicate streams on them.
	for name, svc := range p.Services {
		if composeKind(name) == "" {
			continue
		}
		if got := *svc.Environment["ORCH_STREAM_REPLICAS"]; got != "3" {
			t.Errorf("%s: ORCH_STREAM_REPLICAS=%s, want 3", name, got)
		}
		for _, n := range nats {
			if !strings.Contains(*svc.Environment["ORCH_NATS_URL"], "nats://"+n+":4222") {
				t.Errorf("%s: ORCH_NATS_URL does not name %s", name, n)
			}
		}
	}
}

// TestComposeRequiresSecrets: without a .env, compose refuses to start
// rather than run a gateway that accepts no webhook.
func TestComposeRequiresSecrets(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.env")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := loadCompose(t, empty)
	if err == nil || !strings.Contains(err.Error(), "ORCH_GITEA_SECRET") {
		t.Errorf("loading compose.yaml without secrets: err = %v, want one naming ORCH_GITEA_SECRET", err)
	}
}

// The compose file says which Compose it needs, and nothing tells an
// operator to run the retired v1 command, `docker-compose`, which does not
// read it.
func TestComposeNeedsComposeV2(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(composeDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "Compose v2") || !strings.Contains(string(data), "`docker compose`") {
		t.Error("compose.yaml does not say it needs Compose v2 (`docker compose`)")
	}
	p := loadComposeExample(t)
	if p.Name == "" {
		t.Error("compose.yaml has no top-level name, the reason it needs Compose v2: say otherwise in its header")
	}
	docs, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	for _, f := range append(docs, filepath.Join(repoRoot, "README.md"), filepath.Join(composeDir, "compose.yaml"), filepath.Join(composeDir, ".env.example")) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "docker-compose ") && !strings.Contains(line, "v1") {
				t.Errorf("%s:%d runs docker-compose (v1): %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// No orch service is made to run as root: the images run as their own
// user, and Claude Code refuses to bypass permissions as root.
func TestComposeServicesNotRoot(t *testing.T) {
	p := loadComposeExample(t)
	for name, svc := range p.Services {
		if composeKind(name) == "" {
			continue
		}
		if u := strings.SplitN(svc.User, ":", 2)[0]; u == "root" || u == "0" {
			t.Errorf("compose service %s runs as user %q", name, svc.User)
		}
	}
}

// Every orch service has a compose health check that its image can run:
// the images have no wget or curl (distroless, Debian slim), so the check
// is the service's own binary, as the image's ENTRYPOINT names it, with
// -healthcheck and a URL on the port the service listens on.
func TestComposeHealthChecksRunInTheImage(t *testing.T) {
	p := loadComposeExample(t)
	for name, svc := range p.Services {
		if composeKind(name) == "" {
			continue
		}
		hc := svc.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) != 4 || hc.Test[0] != "CMD" || hc.Test[2] != "-healthcheck" {
			t.Errorf("%s: health check %v, want [CMD <binary> -healthcheck <url>]", name, hc)
			continue
		}
		var entrypoint string
		for _, in := range parseDockerfile(t, filepath.Join(svc.Build.Context, svc.Build.Dockerfile)) {
			if in.cmd == "ENTRYPOINT" {
				entrypoint = in.args
			}
		}
		if !strings.Contains(entrypoint, `"`+hc.Test[1]+`"`) {
			t.Errorf("%s: health check runs %s, not the binary of the image's ENTRYPOINT %s", name, hc.Test[1], entrypoint)
		}
		_, port, _ := strings.Cut(*svc.Environment["ORCH_HTTP_ADDR"], ":")
		if u := hc.Test[3]; u != "http://127.0.0.1:"+port+"/healthz" && u != "http://127.0.0.1:"+port+"/readyz" {
			t.Errorf("%s: health check GETs %s, want /healthz or /readyz on 127.0.0.1:%s (ORCH_HTTP_ADDR)", name, u, port)
		}
		if hc.Timeout == nil || hc.Timeout.String() == "" || time.Duration(*hc.Timeout) <= service.HealthcheckTimeout {
			t.Errorf("%s: health check timeout %v, want above -healthcheck's own %v", name, hc.Timeout, service.HealthcheckTimeout)
		}
	}
}
