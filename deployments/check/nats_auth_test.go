package check

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/proto"
)

var updateUsers = flag.Bool("update-nats-users", false, "rewrite deployments/nats/users.conf from kit/natsauth")

// usersConfHeader opens deployments/nats/users.conf.
const usersConfHeader = `# orch's NATS users: one per service, each allowed only the subjects and
# JetStream API calls it uses, and admin for operators (docs/deploy.md,
# "NATS users and what each may do"). Generated from kit/natsauth, the one
# place these permissions are written: change them there, then
#   cd deployments/check && go test -run TestNATSUsersConf -update-nats-users
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
		t.Errorf("%s is not kit/natsauth's table; regenerate it:\n  cd deployments/check && go test -run TestNATSUsersConf -update-nats-users", path)
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
		want := natsauth.ServerPermissions(u.Username)
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
