package check

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/proto"
)

var updateUsers = flag.Bool("update-nats-users", false, "rewrite deployments/nats/users.conf from kit/natsauth")

// usersConfHeader opens deployments/nats/users.conf.
const usersConfHeader = `# orch's NATS users: one per service, each allowed only the subjects and
# JetStream API calls it uses, and admin for operators (docs/deploy.md,
# "NATS users and what each may do"). Generated from kit/natsauth, the one
# place these permissions are written: change them there, then
#   cd deployments/check && go test -run 'TestNATSUsersConf|TestNATSHelmUsersGenerated' -update-nats-users
# Every shipped server config includes this file. The passwords come from
# the server's environment: NATS_GATEWAY_PASSWORD, NATS_RUNNER_PASSWORD,
# NATS_NOTIFIER_PASSWORD and NATS_ADMIN_PASSWORD.
`

// TestNATSUsersConf: the shipped users file is the table of kit/natsauth,
// word for word.
func TestNATSUsersConf(t *testing.T) {
	path := filepath.Join(natsDir, "users.conf")
	want := usersConfHeader + natsauth.Config()
	if *updateUsers {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is not kit/natsauth's table; regenerate it:\n  cd deployments/check && go test -run 'TestNATSUsersConf|TestNATSHelmUsersGenerated' -update-nats-users", path)
	}
}

// helmAuthorization renders the table as the NATS chart's
// config.merge.authorization, each password the server's environment
// variable (<< $VAR >>: the chart writes it unquoted).
func helmAuthorization() string {
	var b strings.Builder
	b.WriteString("    authorization:\n      users:\n")
	for _, u := range natsauth.Users() {
		p := natsauth.For(u)
		fmt.Fprintf(&b, "        - user: %s\n          password: << $%s >>\n          permissions:\n", u, natsauth.PasswordVar(u))
		for _, l := range []struct {
			kind     string
			subjects []string
		}{{"publish", p.Publish}, {"subscribe", p.Subscribe}} {
			fmt.Fprintf(&b, "            %s:\n              allow:\n", l.kind)
			for _, s := range l.subjects {
				fmt.Fprintf(&b, "                - %q\n", s)
			}
		}
	}
	return b.String()
}

// TestNATSHelmUsersGenerated: the users in the NATS chart's values are
// kit/natsauth's table, between the markers that -update-nats-users
// rewrites.
func TestNATSHelmUsersGenerated(t *testing.T) {
	path := filepath.Join(k8sDir, "nats", "values.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "    # BEGIN kit/natsauth: generated, see deployments/nats/users.conf\n", "    # END kit/natsauth\n"
	s := string(data)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q ... %q block", path, strings.TrimSpace(begin), strings.TrimSpace(end))
	}
	want := helmAuthorization()
	if *updateUsers {
		s = s[:i+len(begin)] + want + s[j:]
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		i, j = strings.Index(s, begin), strings.Index(s, end)
	}
	if got := s[i+len(begin) : j]; got != want {
		t.Errorf("%s: the users are not kit/natsauth's table; regenerate them:\n  cd deployments/check && go test -run 'TestNATSUsersConf|TestNATSHelmUsersGenerated' -update-nats-users", path)
	}
}

// setPasswordVars gives the server's password variables test values, as
// the deployments' environment does.
func setPasswordVars(t *testing.T) {
	for _, u := range natsauth.Users() {
		t.Setenv(natsauth.PasswordVar(u), "pw-"+u)
	}
}

// checkUsers compares a server's users with the table: every user, its
// permissions exactly, no other user and no way in without one.
func checkUsers(t *testing.T, where string, opts *server.Options) {
	t.Helper()
	if opts.NoAuthUser != "" || len(opts.Nkeys) > 0 || opts.Username != "" || opts.Authorization != "" {
		t.Errorf("%s: a login besides the users (no_auth_user %q, single user %q, token set %v, %d nkeys)",
			where, opts.NoAuthUser, opts.Username, opts.Authorization != "", len(opts.Nkeys))
	}
	var names []string
	for _, u := range opts.Users {
		names = append(names, u.Username)
		want := embedded.Permissions(u.Username)
		if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
			t.Errorf("%s: user %s has no permissions", where, u.Username)
			continue
		}
		if u.Password != "pw-"+u.Username {
			t.Errorf("%s: user %s's password is not $%s", where, u.Username, natsauth.PasswordVar(u.Username))
		}
		for _, p := range []struct {
			kind      string
			got, want *server.SubjectPermission
		}{{"publish", u.Permissions.Publish, want.Publish}, {"subscribe", u.Permissions.Subscribe, want.Subscribe}} {
			if !slices.Equal(slices.Sorted(slices.Values(p.got.Allow)), p.want.Allow) || len(p.got.Deny) > 0 {
				t.Errorf("%s: user %s may %s %v (deny %v), kit/natsauth says %v", where, u.Username, p.kind, p.got.Allow, p.got.Deny, p.want.Allow)
			}
		}
		if u.Permissions.Response != nil {
			t.Errorf("%s: user %s has allow_responses, which kit/natsauth does not grant", where, u.Username)
		}
	}
	slices.Sort(names)
	if want := slices.Sorted(slices.Values(natsauth.Users())); !slices.Equal(names, want) {
		t.Errorf("%s: users %v, want %v", where, names, want)
	}
}

// TestNATSConfigsAuthenticate: every shipped server config takes exactly
// kit/natsauth's users with their permissions.
func TestNATSConfigsAuthenticate(t *testing.T) {
	setPasswordVars(t)
	paths, _ := filepath.Glob(filepath.Join(natsDir, "*.conf"))
	for _, p := range paths {
		if filepath.Base(p) == "users.conf" {
			continue
		}
		opts, err := server.ProcessConfigFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		checkUsers(t, filepath.Base(p), opts)
	}
}

// startFromConfig runs the nats-server that a shipped config describes in
// this process, on a free port with a temporary store and no cluster.
func startFromConfig(t *testing.T, path string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.Cluster = server.ClusterOpts{}
	opts.Routes = nil
	opts.ServerName = ""
	opts.NoSigs, opts.NoLog = true, true
	opts.LameDuckDuration, opts.LameDuckGracePeriod = 0, 0
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatalf("%s: server not ready", path)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// TestNATSConfigsRefuseAnonymous starts a server from each shipped config
// (nats-server -c, in this process): an anonymous client is refused, the
// runner's user logs in and ensures the topology, and cannot delete a
// stream.
func TestNATSConfigsRefuseAnonymous(t *testing.T) {
	setPasswordVars(t)
	paths, _ := filepath.Glob(filepath.Join(natsDir, "*.conf"))
	for _, p := range paths {
		if filepath.Base(p) == "users.conf" {
			continue
		}
		t.Run(filepath.Base(p), func(t *testing.T) {
			s := startFromConfig(t, p)
			if nc, err := nats.Connect(s.ClientURL(), nats.NoReconnect()); err == nil {
				nc.Close()
				t.Fatal("an anonymous client connected")
			} else if !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("anonymous: %v, want an authorization violation", err)
			}
			denied := make(chan error, 8)
			nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(natsauth.Runner, "pw-runner"),
				nats.CustomInboxPrefix(natsauth.InboxPrefix(natsauth.Runner)),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if _, err := (proto.Topology{}).Ensure(ctx, js); err != nil {
				t.Fatalf("runner ensures the topology: %v", err)
			}
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			defer dcancel()
			_ = js.DeleteStream(dctx, proto.StreamJobs)
			select {
			case err := <-denied:
				if !strings.Contains(err.Error(), "$JS.API.STREAM.DELETE.JOBS") {
					t.Errorf("deleting JOBS: %v", err)
				}
			case <-ctx.Done():
				t.Error("the runner's user deleted JOBS")
			}
		})
	}
}

// TestDeploymentsLogInPerService: in compose, Kubernetes and systemd each
// orch service logs in as its own NATS user, with a password that no
// other service is given.
func TestDeploymentsLogInPerService(t *testing.T) {
	var all []deploymentEnv
	all = append(all, composeEnvs(t)...)
	all = append(all, kubernetesEnvs(t)...)
	all = append(all, systemdEnvs(t)...)
	owner := map[string]string{} // password source -> service
	for _, d := range all {
		kind := strings.SplitN(d.where, "/", 2)[0]
		if got := d.env["ORCH_NATS_USER"]; got != d.service {
			t.Errorf("%s: ORCH_NATS_USER=%q, want %q", d.where, got, d.service)
		}
		if d.env["ORCH_NATS_CREDS"] != "" || d.env["ORCH_NATS_NKEY_SEED_FILE"] != "" {
			t.Errorf("%s: another NATS login beside the user", d.where)
		}
		var source string
		switch file := d.env["ORCH_NATS_PASSWORD_FILE"]; {
		case file != "":
			f, ok := d.files[file]
			if !ok || !f.secret || strings.TrimSpace(f.content) == "" {
				t.Errorf("%s: ORCH_NATS_PASSWORD_FILE %s is no secret the deployment mounts", d.where, file)
				continue
			}
			source = kind + " " + f.origin
		case d.env["ORCH_NATS_PASSWORD"] != "":
			// systemd: the service's own env file, which no other unit reads.
			source = kind + " " + d.where
		default:
			t.Errorf("%s: no NATS password", d.where)
			continue
		}
		if o, ok := owner[source]; ok && o != d.service {
			t.Errorf("%s: the %s's NATS password (%s) is the %s's too", d.where, d.service, source, o)
		}
		owner[source] = d.service
	}
}

// TestComposeNATSNodesHaveTheUsers: every node reads users.conf and the
// four passwords.
func TestComposeNATSNodesHaveTheUsers(t *testing.T) {
	p := loadComposeExample(t)
	for name, svc := range p.Services {
		if !strings.HasPrefix(name, "nats-") {
			continue
		}
		if !slices.ContainsFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Target == "/etc/nats/users.conf" && filepath.Base(v.Source) == "users.conf"
		}) {
			t.Errorf("%s does not mount deployments/nats/users.conf beside its config", name)
		}
		for _, u := range natsauth.Users() {
			if v := svc.Environment[natsauth.PasswordVar(u)]; v == nil || *v == "" {
				t.Errorf("%s: no %s", name, natsauth.PasswordVar(u))
			}
		}
	}
	// Without the passwords compose refuses to start.
	env := filepath.Join(t.TempDir(), "no-nats.env")
	data, err := os.ReadFile(filepath.Join(composeDir, ".env.example"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "NATS_") || !strings.Contains(l, "_PASSWORD=") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(env, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadCompose(t, env); err == nil || !strings.Contains(err.Error(), "_PASSWORD") {
		t.Errorf("compose without NATS passwords: %v, want it refused", err)
	}
}

// TestNATSHelmAuthorization: the NATS chart's values carry kit/natsauth's
// users, each password from its own Secret.
func TestNATSHelmAuthorization(t *testing.T) {
	type subjects struct {
		Allow []string `json:"allow"`
	}
	var v struct {
		Config struct {
			Merge struct {
				Authorization struct {
					Users []struct {
						User        string `json:"user"`
						Password    string `json:"password"`
						Permissions struct {
							Publish   subjects `json:"publish"`
							Subscribe subjects `json:"subscribe"`
						} `json:"permissions"`
					} `json:"users"`
				} `json:"authorization"`
			} `json:"merge"`
		} `json:"config"`
		Container struct {
			Env map[string]struct {
				ValueFrom struct {
					SecretKeyRef struct {
						Name string `json:"name"`
						Key  string `json:"key"`
					} `json:"secretKeyRef"`
				} `json:"valueFrom"`
			} `json:"env"`
		} `json:"container"`
	}
	readYAML(t, filepath.Join(k8sDir, "nats", "values.yaml"), &v)
	o := loadK8s(t)
	var names []string
	for _, u := range v.Config.Merge.Authorization.Users {
		names = append(names, u.User)
		want := natsauth.For(u.User)
		if !slices.Equal(u.Permissions.Publish.Allow, want.Publish) || !slices.Equal(u.Permissions.Subscribe.Allow, want.Subscribe) {
			t.Errorf("values.yaml: user %s's permissions are not kit/natsauth's:\n publish %v\n want    %v", u.User, u.Permissions.Publish.Allow, want.Publish)
		}
		pv := natsauth.PasswordVar(u.User)
		if u.Password != "<< $"+pv+" >>" {
			t.Errorf("values.yaml: user %s's password %q, want << $%s >>", u.User, u.Password, pv)
		}
		ref := v.Container.Env[pv].ValueFrom.SecretKeyRef
		if ref.Name != "orch-nats-"+u.User || ref.Key != "password" {
			t.Errorf("values.yaml: %s from %+v, want Secret orch-nats-%s key password", pv, ref, u.User)
		} else if s := o.secret(ref.Name); s == nil || s.StringData["password"] == "" {
			t.Errorf("values.yaml: %s reads Secret %s, which deployments/k8s does not define", pv, ref.Name)
		}
	}
	slices.Sort(names)
	if want := slices.Sorted(slices.Values(natsauth.Users())); !slices.Equal(names, want) {
		t.Errorf("values.yaml: users %v, want %v", names, want)
	}
}

// TestSystemdServicesOwnUsers: each orch unit runs as its own user, reads
// only its own env file beside the shared one, and the NATS server's unit
// has the four passwords.
func TestSystemdServicesOwnUsers(t *testing.T) {
	users := map[string]string{}
	readers := map[string][]string{}
	for _, u := range loadUnits(t) {
		name := filepath.Base(u.path)
		for _, f := range u.values("Service", "EnvironmentFile") {
			readers[f] = append(readers[f], name)
		}
		svc := orchUnitService(u.path)
		if svc == "" {
			continue
		}
		user := u.value("Service", "User")
		if user != "orch-"+svc || u.value("Service", "Group") != user {
			t.Errorf("%s: User=%s Group=%s, want orch-%s for both", name, user, u.value("Service", "Group"), svc)
		}
		if o, ok := users[user]; ok {
			t.Errorf("%s and %s run as the same user %s", name, o, user)
		}
		users[user] = name
	}
	for f, units := range readers {
		if f != "/etc/orch/orch.env" && len(units) > 1 {
			t.Errorf("%s is read by %v: a service's env file is its own", f, units)
		}
	}
	vars, err := readEnvFile(filepath.Join(systemdDir, "env", "nats.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range natsauth.Users() {
		if vars[natsauth.PasswordVar(u)] == "" {
			t.Errorf("env/nats.env: no %s", natsauth.PasswordVar(u))
		}
	}
	if got := readers["/etc/orch/nats.env"]; !slices.Equal(got, []string{"nats-server.service"}) {
		t.Errorf("/etc/orch/nats.env is read by %v, want nats-server.service alone", got)
	}
}
