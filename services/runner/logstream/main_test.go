package logstream

import (
	"testing"

	"github.com/orch-dev/orch/kit/natstest"
)

// TestMain checks that every Publisher's goroutine ends with Close.
func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }
