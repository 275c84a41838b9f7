package soak

import (
	"testing"

	"github.com/orch-dev/orch/kit/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }
