package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/natstest"
)

// Settings that contradict each other stop the service at start, each
// with a message naming the variables.
func TestConflictingNATSLoginsRefused(t *testing.T) {
	t.Parallel()
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"ORCH_NATS_USER": "runner"}, "ORCH_NATS_USER \"runner\" needs ORCH_NATS_PASSWORD"},
		{map[string]string{"ORCH_NATS_PASSWORD": "s3cret"}, "needs ORCH_NATS_USER"},
		{map[string]string{"ORCH_NATS_USER": "runner", "ORCH_NATS_PASSWORD": "s3cret", "ORCH_NATS_PASSWORD_FILE": pwFile}, "set one, not both"},
		{map[string]string{"ORCH_NATS_USER": "runner", "ORCH_NATS_PASSWORD": "s3cret", "ORCH_NATS_CREDS": "/x.creds"}, "one way to log in"},
		{map[string]string{"ORCH_NATS_NKEY_SEED_FILE": "/seed", "ORCH_NATS_CREDS": "/x.creds"}, "one way to log in"},
		{map[string]string{"ORCH_NATS_CERT_FILE": "/c.pem"}, "ORCH_NATS_CERT_FILE and ORCH_NATS_KEY_FILE go together"},
		{map[string]string{"ORCH_NATS_USER": "runner", "ORCH_NATS_PASSWORD_FILE": filepath.Join(t.TempDir(), "missing")}, "ORCH_NATS_PASSWORD_FILE"},
		{map[string]string{"ORCH_NATS_NKEY_SEED_FILE": filepath.Join(t.TempDir(), "missing")}, "ORCH_NATS_NKEY_SEED_FILE"},
	} {
		var c struct{ Common }
		err := Parse(&c, tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: the error shows the password: %v", tc.env, err)
		}
	}
	var c struct{ Common }
	if err := Parse(&c, map[string]string{"ORCH_NATS_USER": "runner", "ORCH_NATS_PASSWORD_FILE": pwFile}); err != nil {
		t.Errorf("user and password file refused: %v", err)
	}
}

// The password prints as [redacted], however the configuration is logged
// or formatted.
func TestNATSPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	var c struct{ Common }
	if err := Parse(&c, map[string]string{"ORCH_NATS_USER": "runner", "ORCH_NATS_PASSWORD": "s3cret"}); err != nil {
		t.Fatal(err)
	}
	if c.NATSPassword != "s3cret" {
		t.Fatalf("password not read: %q", string(c.NATSPassword))
	}
	core, logs := observer.New(zapcore.DebugLevel)
	zap.New(core).Info("config", zap.Any("cfg", c), zap.Stringer("pw", c.NATSPassword))
	for _, s := range []string{fmt.Sprintf("%v %+v %#v %s", c, c, c, c.NATSPassword), fmt.Sprint(logs.All()[0].ContextMap())} {
		if strings.Contains(s, "s3cret") {
			t.Errorf("password printed: %s", s)
		}
	}
}

// Connect logs in as the service's user (the password from its file) and
// ensures the topology within that user's permissions; its requests are
// answered on the service's own inbox prefix.
func TestConnectAsServiceUser(t *testing.T) {
	t.Parallel()
	s := natstest.AuthServer(t)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(natstest.Password(natsauth.Runner)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	nc, _, _, err := Connect(ctx, Common{NATSURL: s.URL(), NATSUser: natsauth.Runner, NATSPasswordFile: pwFile}, natsauth.Runner, nil, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.NewRespInbox(); !strings.HasPrefix(got, natsauth.InboxPrefix(natsauth.Runner)+".") {
		t.Errorf("inbox %s, want the runner's prefix", got)
	}
	// A call the runner may not make is logged at warn.
	if err := nc.Publish("dlq.acme.fix", nil); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if logs.FilterMessage("nats error").Len() == 0 {
			return fmt.Errorf("no permission violation logged: %v", logs.All())
		}
		return nil
	})
	if e := logs.FilterMessage("nats error").All()[0]; !strings.Contains(fmt.Sprint(e.ContextMap()), `Permissions Violation for Publish to "dlq.acme.fix"`) {
		t.Errorf("logged %v", e.ContextMap())
	}
}

// A refused login ends Connect with the server's reason instead of
// waiting for JetStream for ever.
func TestConnectWithWrongPasswordFails(t *testing.T) {
	t.Parallel()
	s := natstest.AuthServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, c := range []Common{
		{NATSURL: s.URL()},
		{NATSURL: s.URL(), NATSUser: natsauth.Runner, NATSPassword: "wrong"},
	} {
		_, _, _, err := Connect(ctx, c, natsauth.Runner, nil, zap.NewNop())
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Errorf("user %q: %v, want an authorization violation", c.NATSUser, err)
		}
		if ctx.Err() != nil {
			t.Fatal("Connect waited until the test's deadline")
		}
	}
}
