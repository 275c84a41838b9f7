package notifier

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/internal/logtest"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// testToken is the bot token of every test; it must never reach a log
// (setup fails a test with a log line holding "SECRET").
const testToken = "123456:SECRET-token-never-logged"

// bundle is a JetStream server with orch's topology, a fake Telegram and
// a fake runner, for one test.
type bundle struct {
	t       *testing.T
	srv     *embedded.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	status  *status.Store
	tg      *testkit.Telegram
	runner  jetstream.Consumer
	logs    *observer.ObservedLogs
	log     *zap.Logger
	dir     string
	attempt int // the runner's MaxDeliver
	bg      context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := natstest.Server(t)
	nc, js, kv := natstest.Connect(t, srv)
	b := &bundle{t: t, srv: srv, nc: nc, js: js, status: status.New(kv), tg: testkit.NewTelegram(t, testToken), dir: t.TempDir(), attempt: 3, bg: t.Context()}
	b.log, b.logs = logtest.New(t, "SECRET") // testToken and every tracker token of the tests
	// The runner's consumer, exactly as a runner creates it.
	var err error
	b.runner, err = js.CreateOrUpdateConsumer(b.ctx(), proto.StreamJobs, proto.RunnerConsumer(100, b.attempt, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// setupRunning is setup with a notifier of the default configuration
// started.
func setupRunning(t *testing.T) (*bundle, *running) {
	t.Helper()
	b := setup(t)
	return b, b.start(b.config(), hooks{})
}

// ctx is the context of the test's own calls; it ends with the test.
func (b *bundle) ctx() context.Context { return b.bg }

// config is the notifier's configuration for this bundle: fast retries
// and a fast pace, so tests take seconds.
func (b *bundle) config() Config {
	return Config{
		Common:           service.Common{NATSURL: b.srv.URL()},
		TelegramBotToken: testToken,
		TelegramChatID:   "-1001234",
		TelegramAPIURL:   b.tg.URL,
		TelegramRate:     50,
		RetryDelay:       50 * time.Millisecond,
		RetryMaxDelay:    400 * time.Millisecond,
		RejectedDelay:    time.Minute,
	}
}

// running is a notifier started by a test.
type running struct {
	n      *Notifier
	cancel context.CancelFunc
	done   chan error
}

// stop cancels the notifier and waits until it returns.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("notifier returned %v", err)
		}
		r.done <- nil // for a later stop
	case <-time.After(time.Minute):
		t.Fatal("notifier did not stop within a minute")
	}
}

// start runs a notifier until the test ends or it is stopped.
func (b *bundle) start(cfg Config, h hooks) *running {
	t := b.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	started := make(chan *Notifier, 1)
	h.started = func(n *Notifier) { started <- n }
	go func() { r.done <- run(ctx, cfg, b.log, h) }()
	select {
	case r.n = <-started:
	case err := <-r.done:
		t.Fatalf("notifier did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("notifier did not start within 30s")
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// queue publishes a job to JOBS and writes its status record, as the
// gateway and the runner would: the last attempt's error, exit code and
// log file (on this host).
func (b *bundle) queue(name, title string) *proto.Job {
	t := b.t
	t.Helper()
	job := &proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID(t.Name() + "/" + name),
		Kind: proto.KindReview, Project: "widgets",
		Task:      proto.Task{ID: "pr-" + proto.Token(name), Title: title, URL: "https://git.example.com/acme/widgets/pulls/42", PR: 42},
		Source:    proto.Source{System: "gitea", Event: "pull_request"},
		CreatedAt: time.Now().UTC(),
	}
	data, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(proto.JobSubject(job.Project, job.Kind))
	m.Data = data
	m.Header.Set(proto.HeaderMsgID, job.ID)
	if _, err := b.js.PublishMsg(b.ctx(), m); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(b.dir, job.ID+".log")
	var lg strings.Builder
	for i := range 40 {
		fmt.Fprintf(&lg, "agent line %d\n", i)
	}
	lg.WriteString("FAIL: want <expected> & got <nil>\n")
	if err := os.WriteFile(logPath, []byte(lg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	code := 3
	statustest.Set(t, b.status, job, func(s *proto.Status) {
		s.State, s.Attempt, s.MaxAttempts = proto.StateRetrying, b.attempt, b.attempt
		s.Runner, s.ExitCode, s.Log, s.CostUSD, s.Turns = "runner-1", &code, logPath, 0.42, 7
		s.Error = "agent exited with code 3: want <expected>"
	})
	return job
}

// action is what the fake runner does with a job.
type action int

const (
	actFail   action = iota // NAK until MaxDeliver: MAX_DELIVERIES
	actTerm                 // Term with a reason naming the job: MSG_TERMINATED
	actCancel               // Term with reason "cancelled"
	// actServerTerm is a Term with a reason of the server's own, as
	// nats-server sends when a clustered work queue catches up.
	actServerTerm
)

// advisories is how many advisories JOBS_ADVISORIES has captured.
func (b *bundle) advisories() uint64 {
	b.t.Helper()
	return b.streamMsgs(proto.StreamAdvisories)
}

func (b *bundle) streamMsgs(name string) uint64 {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx(), name)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(b.ctx())
	if err != nil {
		b.t.Fatal(err)
	}
	return info.State.Msgs
}

// run plays the runner over the queued jobs until each has produced its
// advisory: it NAKs a failing job on every delivery (JetStream emits
// MAX_DELIVERIES on the pull after the last one) and terminates the
// others, as the runner does.
func (b *bundle) run(jobs map[string]action) {
	t := b.t
	t.Helper()
	want := b.advisories() + uint64(len(jobs))
	natstest.CheckFor(t, 60*time.Second, time.Millisecond, func() error {
		batch, err := b.runner.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			job, err := proto.DecodeJob(msg.Data())
			if err != nil {
				t.Fatalf("fake runner: %v", err)
			}
			switch jobs[job.ID] {
			case actFail:
				err = msg.Nak()
			case actTerm:
				err = msg.TermWithReason(proto.TermReason(job.ID, "cannot check out branch <agent/x> & more"))
			case actCancel:
				err = msg.TermWithReason(proto.ReasonCancelled)
			case actServerTerm:
				err = msg.TermWithReason("Unacknowledged message was deleted")
			}
			if err != nil {
				t.Fatalf("fake runner: %v", err)
			}
		}
		if got := b.advisories(); got < want {
			return fmt.Errorf("%d advisories, want %d", got, want)
		}
		return nil
	})
}

// settled waits until the notifier has handled every advisory.
func (b *bundle) settled(timeout time.Duration) {
	t := b.t
	t.Helper()
	natstest.CheckFor(t, timeout, 20*time.Millisecond, func() error {
		c, err := b.js.Consumer(b.ctx(), proto.StreamAdvisories, proto.ConsumerNotifier)
		if err != nil {
			return err
		}
		info, err := c.Info(b.ctx())
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("notifier consumer: %d pending, %d unacked", info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// messagesFor counts the accepted messages that name job.
func (b *bundle) messagesFor(id string) int {
	n := 0
	for _, m := range b.tg.Messages() {
		if strings.Contains(m.Text, id) {
			n++
		}
	}
	return n
}

// checkDeadLettered checks that each job is in JOBS_DLQ once, gone from
// JOBS, alerted once and recorded failed.
func (b *bundle) checkDeadLettered(jobs ...*proto.Job) {
	t := b.t
	t.Helper()
	if n := b.streamMsgs(proto.StreamJobs); n != 0 {
		t.Errorf("JOBS holds %d messages, want 0", n)
	}
	if n := b.streamMsgs(proto.StreamDLQ); n != uint64(len(jobs)) {
		t.Errorf("JOBS_DLQ holds %d messages, want %d", n, len(jobs))
	}
	for _, job := range jobs {
		st, _, err := b.status.Get(b.ctx(), job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != proto.StateFailed || st.DLQSeq == 0 || !st.Alerted {
			t.Errorf("job %s: state %s, dlq seq %d, alerted %v; want failed, dead-lettered, alerted", job.ID, st.State, st.DLQSeq, st.Alerted)
		}
		if n := b.messagesFor(job.ID); n != 1 {
			t.Errorf("job %s: %d messages, want 1", job.ID, n)
		}
	}
}
