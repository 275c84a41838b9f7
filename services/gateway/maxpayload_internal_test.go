package gateway

import (
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/service"
)

// A task bound over half the server's max payload stops the gateway once
// it is connected, naming what to lower.
func TestTaskBoundMustFitTheServersMaxPayload(t *testing.T) {
	for _, tt := range []struct {
		maxTask, maxPayload int64
		ok                  bool
	}{
		{256 << 10, 1 << 20, true},
		{512 << 10, 1 << 20, true},
		{256 << 10, 256 << 10, false},
		{300 << 10, 512 << 10, false},
	} {
		err := checkMaxPayload(service.ByteSize(tt.maxTask), tt.maxPayload)
		if (err == nil) != tt.ok || (err != nil && !strings.Contains(err.Error(), "ORCH_MAX_TASK_BYTES")) {
			t.Errorf("max task %d, max payload %d: %v", tt.maxTask, tt.maxPayload, err)
		}
	}
}
