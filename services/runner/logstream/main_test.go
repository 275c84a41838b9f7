package logstream

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/orch-dev/orch/kit/natstest"
)

// TestMain checks that every Publisher's goroutine ends with Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServer()...)
}
