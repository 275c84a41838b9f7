package runner_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// An agent that succeeded keeps its success when the lease is lost after
// it ended, while its output waits for JetStream: the job is done after
// one run, not run again once JetStream is back.
func TestSuccessStandsWhenTheLeaseIsLostAfterTheAgentEnded(t *testing.T) {
	e := newEnv(t, "")
	core, logs := observer.New(zap.InfoLevel)
	// The agent ends when the test says so, once JetStream is down.
	e.startLogged(e.config("r1", e.script(`touch $RUNS/ran.$ORCH_ATTEMPT
until test -e $RUNS/end; do sleep 0.05; done
echo finished
`)), core)
	j := job("lease-after-end", "task-l", proto.KindImplement)
	e.enqueue(j)
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		_, err := os.Stat(filepath.Join(e.runs, "ran.1"))
		return err
	})
	e.srv.Shutdown()
	if err := os.WriteFile(filepath.Join(e.runs, "end"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The outage lasts until the runner has given up the lease, which it
	// does within 2/3 of AckWait of its last beat.
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if logs.FilterMessageSnippet("lease lost").Len() == 0 {
			return os.ErrNotExist
		}
		return nil
	})
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	st := e.waitState(j.ID, proto.StateDone, 60*time.Second)
	e.waitStreamEmpty(30 * time.Second)
	runs, _ := filepath.Glob(filepath.Join(e.runs, "ran.*"))
	if len(runs) != 1 || st.Attempt != 1 {
		t.Errorf("agent runs %v, record at attempt %d; want one run, done on attempt 1", runs, st.Attempt)
	}
	for _, l := range logs.All() {
		if strings.Contains(l.Message, "not settling") {
			t.Errorf("runner logged %q after its agent had succeeded", l.Message)
		}
	}
}
