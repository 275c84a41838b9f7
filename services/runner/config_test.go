package runner_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/services/runner"
)

// ORCH_LOG_BUFFER=0 would hold no output at all: the runner refuses it at
// start, naming the variable, instead of choosing a size of its own.
func TestZeroLogBufferRefusedAtStart(t *testing.T) {
	t.Setenv("ORCH_LOG_BUFFER", "0")
	var cfg runner.Config
	if err := service.FromEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	err := runner.Run(context.Background(), cfg, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "ORCH_LOG_BUFFER") {
		t.Fatalf("Run with ORCH_LOG_BUFFER=0 = %v, want an error naming ORCH_LOG_BUFFER", err)
	}
}
