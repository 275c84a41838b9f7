package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// trackerVars are the settings of the tracker write-back every notifier
// deployment offers, set or (systemd) as commented lines to uncomment.
var trackerVars = []string{
	"ORCH_GITEA_URL", "ORCH_GITEA_TOKEN_FILE",
	"ORCH_PLANE_URL", "ORCH_PLANE_TOKEN_FILE",
	"ORCH_PUBLIC_URL",
}

// inlineTokens are the tracker tokens as plain variables: a deployment
// gives them as files (ORCH_..._TOKEN_FILE), never inline, so that they
// show in no `docker inspect`, `kubectl describe` or /proc/<pid>/environ.
var inlineTokens = []string{"ORCH_GITEA_TOKEN", "ORCH_PLANE_TOKEN"}

// TestNotifierWriteback checks that every deployment wires the notifier's
// tracker write-back: the same project registry the gateway and the
// runner read, the trackers' URLs and token files (set, or offered where
// a tracker is optional), tokens only from a Secret or a file, and that
// the notifier accepts the result once the trackers are filled in.
func TestNotifierWriteback(t *testing.T) {
	var all []deploymentEnv
	all = append(all, composeEnvs(t)...)
	all = append(all, kubernetesEnvs(t)...)
	all = append(all, systemdEnvs(t)...)

	byKind := map[string][]deploymentEnv{}
	for _, d := range all {
		kind := strings.SplitN(d.where, "/", 2)[0]
		byKind[kind] = append(byKind[kind], d)
		for _, v := range inlineTokens {
			_, set := d.env[v]
			_, offered := d.commented[v]
			if set || offered {
				t.Errorf("%s gives %s inline; give it as a file (%s_FILE)", d.where, v, v)
			}
		}
	}

	for kind, envs := range byKind {
		var notifiers []deploymentEnv
		for _, d := range envs {
			if d.service == "notifier" {
				notifiers = append(notifiers, d)
			}
		}
		if len(notifiers) == 0 {
			t.Errorf("%s: no notifier", kind)
		}
		for _, n := range notifiers {
			checkRegistryShared(t, n, envs)
			for _, v := range trackerVars {
				_, set := n.env[v]
				_, offered := n.commented[v]
				if !set && !offered {
					t.Errorf("%s neither sets nor offers %s", n.where, v)
				}
			}
			checkTokenFiles(t, n)
			if err := serviceNamed(t, "notifier").check(filledTrackerEnv(t, n)); err != nil {
				t.Errorf("%s: with the trackers filled in, the notifier rejects its configuration: %v", n.where, err)
			}
		}
	}
}

// checkRegistryShared checks that the notifier n reads the project
// registry from the same path, and the same source, as the gateway and
// the runner of its deployment.
func checkRegistryShared(t *testing.T, n deploymentEnv, envs []deploymentEnv) {
	t.Helper()
	path := n.env["ORCH_PROJECTS_FILE"]
	if path == "" {
		t.Errorf("%s: the notifier gets no ORCH_PROJECTS_FILE", n.where)
		return
	}
	if n.files != nil {
		if _, ok := n.files[path]; !ok {
			t.Errorf("%s: ORCH_PROJECTS_FILE=%s is no file the deployment mounts", n.where, path)
		}
	}
	for _, d := range envs {
		if d.service != "gateway" && d.service != "runner" {
			continue
		}
		if got := d.env["ORCH_PROJECTS_FILE"]; got != path {
			t.Errorf("%s reads the registry at %s, %s at %s", n.where, path, d.where, got)
			continue
		}
		if want, got := d.files[path].origin, n.files[path].origin; want != got {
			t.Errorf("%s: registry from %q, %s's from %q", n.where, got, d.where, want)
		}
	}
}

// checkTokenFiles checks that a token file the deployment sets is one it
// fills from a Secret (compose, Kubernetes) or an absolute path on the
// host (systemd, commented out until a tracker is used).
func checkTokenFiles(t *testing.T, n deploymentEnv) {
	t.Helper()
	for _, v := range []string{"ORCH_GITEA_TOKEN_FILE", "ORCH_PLANE_TOKEN_FILE"} {
		path, set := n.env[v]
		if !set {
			path = n.commented[v]
		}
		switch {
		case path == "":
		case n.files == nil:
			if !filepath.IsAbs(path) {
				t.Errorf("%s: %s=%s is not an absolute path", n.where, v, path)
			}
		case !n.files[path].secret:
			t.Errorf("%s: %s=%s is not a file the deployment fills from a secret", n.where, v, path)
		}
	}
}

// filledTrackerEnv is the notifier's environment in n as an operator
// who uses both trackers has it: URLs set, commented lines uncommented,
// the token files holding a token.
func filledTrackerEnv(t *testing.T, n deploymentEnv) map[string]string {
	t.Helper()
	env := n.checkableEnv(t, true)
	for _, v := range trackerVars {
		if _, set := env[v]; !set {
			env[v] = n.commented[v]
		}
	}
	for _, tracker := range []string{"GITEA", "PLANE"} {
		file := "ORCH_" + tracker + "_TOKEN_FILE"
		if n.files == nil && env[file] != "" {
			// A file on the host: the operator writes it at install time.
			p := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(p, []byte("placeholder\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			env[file] = p
		}
		if url := "ORCH_" + tracker + "_URL"; env[url] == "" {
			env[url] = "https://" + strings.ToLower(tracker) + ".example.com"
		}
	}
	return env
}
