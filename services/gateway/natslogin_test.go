package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/gateway"
)

// A gateway whose NATS login is refused stops with the server's reason,
// as the runner and the notifier do, instead of serving on with /readyz
// at 503 and never trying again.
func TestRefusedNATSLoginStopsTheGateway(t *testing.T) {
	t.Parallel()
	srv := natstest.AuthServer(t)
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	err := gateway.Run(ctx, gateway.Config{
		Common: service.Common{
			NATSURL: srv.URL(), DataDir: e.dataDir,
			NATSUser: natsauth.Gateway, NATSPassword: "a-wrong-password",
		},
		Listener: testkit.Listen(t), ProjectsFile: e.projects, GiteaSecret: giteaSecret, PlaneSecret: planeSecret, APIToken: apiToken,
	}, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("gateway.Run with a wrong NATS password: %v, want the authorization violation", err)
	}
	if ctx.Err() != nil {
		t.Error("gateway.Run returned only at the test's deadline")
	}
}
