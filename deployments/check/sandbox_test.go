package check

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestRunnerDeploymentsConfineAgents: every shipped runner deployment
// sets ORCH_AGENT_SANDBOX=bwrap and carries what bubblewrap needs there:
// the package in the image; user and network namespaces and netlink
// (bwrap brings up the sandbox's loopback) under systemd; the seccomp,
// AppArmor and /proc settings of a container (compose, Kubernetes).
// Without them a runner set to bwrap would not start.
func TestRunnerDeploymentsConfineAgents(t *testing.T) {
	t.Run("image", func(t *testing.T) {
		var installs, env bool
		for _, in := range parseDockerfile(t, filepath.Join(repoRoot, "deployments", "docker", "runner.Dockerfile")) {
			if in.cmd == "RUN" && strings.Contains(in.args, "apt-get install") && slices.Contains(strings.Fields(in.args), "bubblewrap") {
				installs = true
			}
			if in.cmd == "ENV" && slices.Contains(strings.Fields(in.args), "ORCH_AGENT_SANDBOX=bwrap") {
				env = true
			}
		}
		if !installs || !env {
			t.Errorf("runner.Dockerfile: installs bubblewrap %v, sets ORCH_AGENT_SANDBOX=bwrap %v; want both", installs, env)
		}
	})

	t.Run("systemd", func(t *testing.T) {
		for _, u := range loadUnits(t) {
			if orchUnitService(u.path) != "runner" {
				continue
			}
			if env := unitEnv(t, u); env["ORCH_AGENT_SANDBOX"] != "bwrap" {
				t.Errorf("%s: ORCH_AGENT_SANDBOX=%q, want bwrap", u.path, env["ORCH_AGENT_SANDBOX"])
			}
			ns := strings.Fields(u.value("Service", "RestrictNamespaces"))
			for _, want := range []string{"user", "mnt", "pid", "ipc", "uts", "net"} {
				if len(ns) > 0 && (ns[0] == "yes" || ns[0] == "true" || strings.HasPrefix(ns[0], "~") || !slices.Contains(ns, want)) {
					t.Errorf("%s: RestrictNamespaces=%s refuses bwrap's %s namespace", u.path, strings.Join(ns, " "), want)
				}
			}
			if af := u.value("Service", "RestrictAddressFamilies"); af != "" && !slices.Contains(strings.Fields(af), "AF_NETLINK") {
				t.Errorf("%s: RestrictAddressFamilies=%s leaves out AF_NETLINK, with which bwrap brings up the sandbox's loopback", u.path, af)
			}
			if u.value("Service", "PrivateUsers") == "yes" {
				t.Errorf("%s: PrivateUsers=yes", u.path)
			}
		}
	})

	t.Run("compose", func(t *testing.T) {
		p := loadComposeExample(t)
		for name, svc := range p.Services {
			if composeKind(name) != "runner" {
				continue
			}
			if v := svc.Environment["ORCH_AGENT_SANDBOX"]; v == nil || *v != "bwrap" {
				t.Errorf("compose %s: ORCH_AGENT_SANDBOX=%v, want bwrap", name, v)
			}
			for _, want := range []string{"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} {
				if !slices.Contains(svc.SecurityOpt, want) {
					t.Errorf("compose %s: security_opt %v lacks %s, without which bwrap cannot start a sandbox", name, svc.SecurityOpt, want)
				}
			}
		}
	})

	t.Run("kubernetes", func(t *testing.T) {
		o := loadK8s(t)
		c := o.workload(t, "runner").template.Spec.Containers[0]
		if env := o.containerEnv(t, "runner", c); env["ORCH_AGENT_SANDBOX"] != "bwrap" {
			t.Errorf("k8s runner: ORCH_AGENT_SANDBOX=%q, want bwrap", env["ORCH_AGENT_SANDBOX"])
		}
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Fatal("k8s runner: no container securityContext")
		case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined:
			t.Errorf("k8s runner: seccompProfile %v, want Unconfined: the default refuses new namespaces", sc.SeccompProfile)
		case sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined:
			t.Errorf("k8s runner: appArmorProfile %v, want Unconfined: the default refuses mount(2)", sc.AppArmorProfile)
		case sc.ProcMount == nil || *sc.ProcMount != corev1.UnmaskedProcMount:
			t.Errorf("k8s runner: procMount %v, want Unmasked: a masked /proc refuses the sandbox a fresh one", sc.ProcMount)
		case sc.Privileged != nil && *sc.Privileged, sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("k8s runner: privileged or allowing privilege escalation: bwrap needs neither")
		}
	})
}
