package check

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
)

// TestRunnerRunsOtherSchemas is the upgrade rule of docs/deploy.md: a
// runner runs a job written by an older writer (schema 1, no optional
// field) and one written by a newer writer (a higher schema number and
// fields it does not know), so writers and readers can be rolled in any
// order.
func TestRunnerRunsOtherSchemas(t *testing.T) {
	srv := natstest.Server(t)
	_, js, kv := natstest.Connect(t, srv)

	dir := t.TempDir()
	runsDir := filepath.Join(dir, "runs")
	if err := os.MkdirAll(runsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	agent := testkit.AgentScript(t, dir, "agent.sh", fmt.Sprintf("test -f \"$ORCH_TASK_FILE\" || exit 9\necho \"$ORCH_TASK\" >> %q/\"$ORCH_JOB_ID\"\n", runsDir))
	projects, _ := testkit.Project(t, dir, "")

	cfg := runner.Config{Common: service.Common{NATSURL: srv.URL(), DataDir: dir}, ProjectsFile: projects,
		MaxConcurrency: 2, MaxAttempts: 1, AgentCommand: agent, ShutdownGrace: time.Second,
		// A confined agent (auto picks bubblewrap) may write there too.
		AgentSandboxRW: []string{runsDir}}
	testkit.Services(t, map[string]func(context.Context) error{
		"runner": func(ctx context.Context) error {
			return runner.Run(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
		},
	})

	ctx := context.Background()
	st := status.New(kv)
	for _, file := range []string{"schema1-minimal.json", "schema2-unknown-fields.json"} {
		t.Run(file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "jobs", file))
			if err != nil {
				t.Fatal(err)
			}
			// Only what routing needs is read here: the rest stays as the
			// writer wrote it.
			var head struct {
				ID      string `json:"id"`
				Kind    string `json:"kind"`
				Project string `json:"project"`
				Task    struct {
					ID string `json:"id"`
				} `json:"task"`
			}
			if err := json.Unmarshal(raw, &head); err != nil {
				t.Fatal(err)
			}
			msg := nats.NewMsg(proto.JobSubject(head.Project, proto.Kind(head.Kind)))
			msg.Data = raw
			msg.Header.Set(nats.MsgIdHdr, head.ID)
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
			natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
				rec, _, err := st.Get(ctx, head.ID)
				if err != nil {
					return err
				}
				if rec.State != proto.StateDone {
					return fmt.Errorf("job %s is %s (%s), want done", head.ID, rec.State, rec.Error)
				}
				return nil
			})
			ran, err := os.ReadFile(filepath.Join(runsDir, head.ID))
			if err != nil {
				t.Fatalf("the agent did not run: %v", err)
			}
			if want := head.Task.ID + "\n"; string(ran) != want {
				t.Errorf("agent runs: %q, want one run of task %q", ran, head.Task.ID)
			}
		})
	}
}
