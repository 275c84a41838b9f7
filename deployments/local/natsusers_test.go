package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
)

// authServer starts an embedded JetStream server with make run's users
// and passwords (made under a temporary directory), and returns it with
// a function that logs a service's settings in as user.
func authServer(t *testing.T) (*embedded.Server, func(user string, c service.Common) service.Common) {
	t.Helper()
	pw, err := natsPasswords(filepath.Join(t.TempDir(), natsDir))
	if err != nil {
		t.Fatal(err)
	}
	return natstest.AuthServerWith(t, pw), func(user string, c service.Common) service.Common {
		if err := natsLogin(&c, user, pw); err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// TestMakeRunRefusesAnonymousNATS: make run's embedded server takes only
// its users, whose passwords it keeps private in the data directory and
// finds again on the next run; its context logs the nats CLI in as admin.
func TestMakeRunRefusesAnonymousNATS(t *testing.T) {
	dataDir := t.TempDir()
	lr := startMakeRun(t, dataDir, nil)
	if nc, err := nats.Connect(lr.natsURL, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("make run's NATS server took an anonymous client")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous client: %v, want an authorization violation", err)
	}
	files := map[string][]byte{}
	for _, name := range append(natsauth.Users(), "context") {
		path := filepath.Join(dataDir, natsDir, name+".password")
		if name == "context" {
			path = filepath.Join(dataDir, natsDir, contextFile)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", path, fi.Mode().Perm())
		}
		files[name], _ = os.ReadFile(path)
	}
	pw, err := natsPasswords(filepath.Join(dataDir, natsDir))
	if err != nil {
		t.Fatal(err)
	}
	// The services' logins are those files.
	nc, err := nats.Connect(lr.natsURL, nats.UserInfo(natsauth.Runner, pw[natsauth.Runner]), nats.NoReconnect())
	if err != nil {
		t.Fatalf("runner's login: %v", err)
	}
	nc.Close()
	lr.stop()

	// The next run finds the same passwords.
	again, err := natsPasswords(filepath.Join(dataDir, natsDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, user := range natsauth.Users() {
		if again[user] != pw[user] || string(files[user]) != pw[user]+"\n" {
			t.Errorf("%s: a new password on the second run", user)
		}
	}
}

// A NATS login in make run's environment is not one of its users: make
// run says so instead of starting services that cannot log in.
func TestMakeRunRefusesForeignNATSLogin(t *testing.T) {
	c := service.Common{NATSUser: "someone", DataDir: t.TempDir()}
	if err := natsLogin(&c, natsauth.Gateway, map[string]string{}); err == nil {
		t.Error("ORCH_NATS_USER taken under make run")
	}
}
