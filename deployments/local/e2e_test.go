package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

const (
	giteaSecret = "fixture-secret"
	apiToken    = "e2e-token-of-the-local-system-tests"
)

type system struct {
	url      string // the gateway
	runner   string // the runner's /healthz, /readyz, /metrics
	notifier string // the notifier's
	runsDir  string
	telegram *testkit.Telegram
	// js is an admin's view of the server, for what no service's API
	// shows, such as a consumer's acks.
	js jetstream.JetStream
}

// startSystem runs an embedded JetStream server and the three services in
// this process, with a script agent that fails every attempt of task pr-43
// and records each run in runsDir.
func startSystem(t *testing.T) *system {
	return newSystem(t, "", func(runsDir string) string {
		return fmt.Sprintf(`echo "run $ORCH_ATTEMPT of $ORCH_JOB_ID" >> %q/"$ORCH_JOB_ID"
test -f "$ORCH_TASK_FILE" || exit 9
case "$ORCH_TASK" in pr-43) echo "tests failed: <expected> & <got>"; exit 3;; esac
`, runsDir)
	}, func(cfg *runner.Config) {
		cfg.MaxAttempts, cfg.AckWait = 3, 2*time.Second
	})
}

// newSystem runs an embedded JetStream server and the three services in
// this process, as make run does, with the API token (apiToken when
// empty), the agent script agent writes for runsDir, and the runner's
// configuration as tune leaves it. It returns once all three are ready.
func newSystem(t *testing.T, token string, agent func(runsDir string) string, tune func(*runner.Config)) *system {
	dir := t.TempDir()
	// Each service logs in as its own NATS user, as under make run.
	srv, login := authServer(t)
	sys := &system{runsDir: filepath.Join(dir, "runs")}
	if err := os.MkdirAll(sys.runsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	agentCommand := testkit.AgentScript(t, dir, "agent.sh", agent(sys.runsDir))
	// The runner works in real git worktrees: the project's clone_url is
	// a repository made here.
	projects, _ := testkit.Project(t, dir, "")
	sys.telegram = testkit.NewTelegram(t, "123:abc")

	common := service.Common{NATSURL: srv.URL(), DataDir: dir}
	ln, runnerLn, notifierLn := testkit.Listen(t), testkit.Listen(t), testkit.Listen(t)
	sys.url = "http://" + ln.Addr().String()
	sys.runner, sys.notifier = "http://"+runnerLn.Addr().String(), "http://"+notifierLn.Addr().String()
	rn := runner.Config{Common: login(natsauth.Runner, common), ProjectsFile: projects, MaxConcurrency: 2, MaxAttempts: 3,
		RetryDelay: 50 * time.Millisecond, AgentCommand: agentCommand, AckWait: 2 * time.Second,
		KillGrace:     500 * time.Millisecond, // below AckWait/3, as the runner asks
		ShutdownGrace: time.Second, Listener: runnerLn,
		// A confined agent (auto picks bubblewrap) may record its runs.
		AgentSandboxRW: []string{sys.runsDir}}
	tune(&rn)
	log := zaptest.NewLogger(t)
	testkit.Services(t, map[string]func(context.Context) error{
		"gateway": func(ctx context.Context) error {
			return gateway.Run(ctx, gateway.Config{Common: login(natsauth.Gateway, common), ProjectsFile: projects, GiteaSecret: giteaSecret,
				PlaneSecret: "p", APIToken: cmp.Or(token, apiToken), Listener: ln}, log.Named("gateway"))
		},
		"runner": func(ctx context.Context) error { return runner.Run(ctx, rn, log.Named("runner")) },
		"notifier": func(ctx context.Context) error {
			return notifier.Run(ctx, notifier.Config{Common: login(natsauth.Notifier, common), TelegramBotToken: "123:abc", TelegramChatID: "42",
				TelegramAPIURL: sys.telegram.URL, RetryDelay: 100 * time.Millisecond, Listener: notifierLn}, log.Named("notifier"))
		},
	})
	for _, u := range []string{sys.url, sys.runner, sys.notifier} {
		testkit.Ready(t, nil, u, 20*time.Second)
	}
	admin := login(natsauth.Admin, service.Common{})
	nc, err := nats.Connect(srv.URL(), nats.UserInfo(admin.NATSUser, string(admin.NATSPassword)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if sys.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return sys
}

// waitAdvisoriesAcked waits until the notifier has acked every advisory
// in JOBS_ADVISORIES: once it has, none of them is handled again, so no
// alert of theirs can still arrive.
func (s *system) waitAdvisoriesAcked(t *testing.T) {
	t.Helper()
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		stream, err := s.js.Stream(t.Context(), proto.StreamAdvisories)
		if err != nil {
			return err
		}
		last := stream.CachedInfo().State.LastSeq
		cons, err := stream.Consumer(t.Context(), proto.ConsumerNotifier)
		if err != nil {
			return err
		}
		ci := cons.CachedInfo()
		if last == 0 || ci.AckFloor.Stream < last || ci.NumAckPending != 0 || ci.NumPending != 0 {
			return fmt.Errorf("advisories up to seq %d, acked up to %d, %d pending, %d unacked",
				last, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending)
		}
		return nil
	})
}

// postPR sends the pull request fixture, changed by edit, signed, and
// returns the answer's status code and body.
func (s *system) postPR(t *testing.T, edit func(map[string]any)) (int, []byte) {
	t.Helper()
	raw := testkit.EditJSON(t, testkit.ReadFile(t, "testdata/pull_request__opened.json"), edit)
	code, body, err := testkit.Post(t.Context(), nil, s.url+"/webhooks/gitea", testkit.GiteaHeaders(giteaSecret, "pull_request", raw), raw)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// getJSON reads url with the API token.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

type queueAnswer struct {
	Counts map[string]int `json:"counts"`
	Stream struct {
		Messages uint64 `json:"messages"`
	} `json:"stream"`
	Recent []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"recent"`
}

func (s *system) waitState(t *testing.T, id string, want proto.State) {
	t.Helper()
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		var q queueAnswer
		getJSON(t, s.url+"/queue", &q)
		for _, r := range q.Recent {
			if r.ID == id && r.State == string(want) {
				return nil
			}
		}
		return fmt.Errorf("job %s not %s in /queue: %+v", id, want, q.Recent)
	})
}

func (s *system) runs(t *testing.T, id string) int {
	data, err := os.ReadFile(filepath.Join(s.runsDir, id))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// queuePR posts the pull request fixture and returns the id of the one job
// the answer names.
func (s *system) queuePR(t *testing.T, edit func(map[string]any)) string {
	t.Helper()
	code, body := s.postPR(t, edit)
	if code != http.StatusAccepted {
		t.Fatalf("webhook answered %d %s, want 202", code, body)
	}
	var ans struct {
		Jobs []struct{ ID, Kind, Project, Task string } `json:"jobs"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || len(ans.Jobs) != 1 {
		t.Fatalf("webhook answer %s: want one job", body)
	}
	return ans.Jobs[0].ID
}

func TestEndToEnd(t *testing.T) {
	sys := startSystem(t)

	t.Run("a succeeding job ends done", func(t *testing.T) {
		id := sys.queuePR(t, nil)
		sys.waitState(t, id, proto.StateDone)
		if n := sys.runs(t, id); n != 1 {
			t.Errorf("agent ran %d times, want 1", n)
		}
		var ans struct {
			Job    proto.Job    `json:"job"`
			Status proto.Status `json:"status"`
		}
		if code := getJSON(t, sys.url+"/jobs/"+id, &ans); code != http.StatusOK {
			t.Fatalf("GET /jobs/%s: %d", id, code)
		}
		if ans.Job.Kind != proto.KindReview || ans.Job.Task.ID != "pr-42" || ans.Status.State != proto.StateDone || ans.Status.Attempt != 1 {
			t.Errorf("GET /jobs/%s = %+v", id, ans)
		}
		// The same delivery again names the same job and runs nothing.
		if again := sys.queuePR(t, nil); again != id {
			t.Errorf("repeated event queued job %s, want %s", again, id)
		}
	})

	t.Run("a job that always fails is alerted once and dead-lettered", func(t *testing.T) {
		id := sys.queuePR(t, func(p map[string]any) {
			p["number"] = 43
			pr := p["pull_request"].(map[string]any)
			pr["number"] = 43
			pr["title"] = "Breaks <everything> & more"
		})
		sys.waitState(t, id, proto.StateFailed)
		natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			var q queueAnswer
			getJSON(t, sys.url+"/queue", &q)
			if q.Stream.Messages != 0 {
				return fmt.Errorf("JOBS holds %d messages, want 0", q.Stream.Messages)
			}
			if len(sys.telegram.Messages()) != 1 {
				return fmt.Errorf("%d telegram messages, want 1: %+v", len(sys.telegram.Messages()), sys.telegram.Messages())
			}
			return nil
		})
		if n := sys.runs(t, id); n != 3 {
			t.Errorf("agent ran %d times, want ORCH_MAX_ATTEMPTS = 3", n)
		}
		msg := sys.telegram.Messages()[0].Text
		for _, want := range []string{"Breaks &lt;everything&gt; &amp; more", id, "Attempts: 3", "Exit code: 3", "&lt;expected&gt;"} {
			if !strings.Contains(msg, want) {
				t.Errorf("alert lacks %q:\n%s", want, msg)
			}
		}
		// Nothing more arrives later: the advisory is acked, so it is
		// never handled again.
		sys.waitAdvisoriesAcked(t)
		if n := len(sys.telegram.Messages()); n != 1 {
			t.Errorf("%d telegram messages, want exactly 1: %+v", n, sys.telegram.Messages())
		}
		var ans struct {
			Status proto.Status `json:"status"`
		}
		getJSON(t, sys.url+"/jobs/"+id, &ans)
		if ans.Status.DLQSeq == 0 || !ans.Status.Alerted {
			t.Errorf("status after failure = %+v, want dead-lettered and alerted", ans.Status)
		}
	})

	t.Run("every service serves the metrics the README lists", func(t *testing.T) {
		checkMetricsTable(t, map[string]string{"gateway": sys.url, "runner": sys.runner, "notifier": sys.notifier})
	})
}
