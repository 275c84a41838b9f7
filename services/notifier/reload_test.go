package notifier

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
)

// A SIGHUP (systemd's reload) to a notifier without tracker write-back is
// logged and otherwise ignored: it must not end the process. The signal
// goes to the whole test process, so it is sent only once this notifier
// catches it.
func TestSIGHUPWithoutWritebackKeepsRunning(t *testing.T) {
	b, r := setupRunning(t)
	wait := func(msg string) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			if b.logs.FilterMessage(msg).Len() == 0 {
				return fmt.Errorf("no %q logged", msg)
			}
			return nil
		})
	}
	wait("no ORCH_GITEA_URL or ORCH_PLANE_URL: no tracker write-back")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait("SIGHUP: no tracker write-back, nothing to reload")
	select {
	case err := <-r.done:
		r.done <- err
		t.Fatalf("the notifier ended after SIGHUP: %v", err)
	default:
	}
	// Still at work: a failed job is alerted.
	job := b.queue("after-hup", "Still alerted")
	b.run(map[string]action{job.ID: actFail})
	b.settled(30 * time.Second)
	if n := len(b.tg.Messages()); n != 1 {
		t.Errorf("%d alerts after SIGHUP, want 1", n)
	}
}
