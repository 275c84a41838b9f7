package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
)

// A process left behind that keeps the agent's output open holds the
// runner up for OutputWaitDelay at most: the drain gives up, says so in
// the log, and the process's next write fails.
func TestOutputHeldOpenDoesNotHoldRunUp(t *testing.T) {
	r, w, err := outputPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	path := filepath.Join(t.TempDir(), "agent.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := startDrain(r, f, func() {})
	if _, err := w.WriteString("printed before the agent ended\n"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if data, _ := os.ReadFile(path); len(data) == 0 {
			return errors.New("nothing drained yet")
		}
		return nil
	})
	// w stays open, as the leftover process would hold it.
	d.wait(100 * time.Millisecond)
	data, _ := os.ReadFile(path)
	got := string(data)
	if !strings.HasPrefix(got, "printed before the agent ended\n") || !strings.Contains(got, "a process left behind still held it open") {
		t.Errorf("output = %q", got)
	}
	if _, err := w.WriteString("printed after\n"); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("write after the drain gave up: %v, want EPIPE", err)
	}
}
