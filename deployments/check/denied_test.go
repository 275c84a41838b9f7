package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
)

// A Claude Code run whose tools were denied (it exits 0) travels the whole
// way of a terminal failure: the runner fails it after one run and
// terminates it, the notifier alerts once on Telegram with the denied
// tool, dead-letters the job and records it failed and alerted.
func TestDeniedToolsReachTheNotifier(t *testing.T) {
	srv := natstest.Server(t)
	_, js, kv := natstest.Connect(t, srv)
	dir := t.TempDir()

	// The stand-in Claude Code: an executable named claude that prints the
	// real CLI's transcript of a denied Bash call and exits 0.
	transcript, err := filepath.Abs(filepath.Join("testdata", "claude", "permission-denied.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(dir, "runs")
	if err := os.WriteFile(runs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	claude := testkit.Script(t, filepath.Join(dir, "bin", "claude"), fmt.Sprintf("echo run >> %q\ncat %q\n", runs, transcript))
	projects, _ := testkit.Project(t, dir, "")

	tg := testkit.NewTelegram(t, "123:fake")

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	rn := runner.Config{Common: service.Common{NATSURL: srv.URL(), DataDir: filepath.Join(dir, "runner")}, ProjectsFile: projects,
		MaxAttempts: 3, RetryDelay: 100 * time.Millisecond, AgentCommand: claude + " -p --output-format stream-json --verbose",
		ShutdownGrace: time.Second, AckWait: 5 * time.Second,
		// Confined (auto picks bubblewrap where it works), the stand-in
		// may still read its transcript and count its runs.
		AgentSandboxRO: []string{transcript}, AgentSandboxRW: []string{runs}}
	nt := notifier.Config{Common: service.Common{NATSURL: srv.URL(), DataDir: filepath.Join(dir, "notifier")},
		TelegramBotToken: "123:fake", TelegramChatID: "-100", TelegramAPIURL: tg.URL, TelegramRate: 100}
	testkit.Services(t, map[string]func(context.Context) error{
		"runner":   func(ctx context.Context) error { return runner.Run(ctx, rn, log.Named("runner")) },
		"notifier": func(ctx context.Context) error { return notifier.Run(ctx, nt, log.Named("notifier")) },
	})
	ctx := context.Background()

	job := proto.Job{Schema: proto.SchemaVersion, ID: proto.JobID("denied"), Kind: proto.KindImplement, Project: "widgets",
		Task: proto.Task{ID: "task-1", Title: "Add AGENT_WAS_HERE.md"}, Source: proto.Source{System: "api"}, CreatedAt: time.Now().UTC()}
	st := status.New(kv)
	data, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, proto.JobSubject(job.Project, job.Kind), data, jetstream.WithMsgID(job.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Apply(ctx, &job, status.Queue(0)); err != nil && !errors.Is(err, status.ErrExists) {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		s, _, err := st.Get(context.Background(), job.ID)
		if err != nil {
			return err
		}
		if s.State != proto.StateFailed || !s.Alerted || s.DLQSeq == 0 {
			return fmt.Errorf("job is %s, alerted %v, dlq seq %d", s.State, s.Alerted, s.DLQSeq)
		}
		return nil
	})
	messages := tg.Messages()
	if len(messages) != 1 || !strings.Contains(messages[0].Text, "denied Bash") {
		t.Errorf("Telegram got %d messages %+v, want one naming the denied tool", len(messages), messages)
	}
	ran, _ := os.ReadFile(runs)
	if n := strings.Count(string(ran), "run"); n != 1 {
		t.Errorf("the agent ran %d times, want once", n)
	}
}
