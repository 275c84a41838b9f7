package writeback

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/scrub"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/kit/trackertest"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/internal/logtest"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// Tokens of every test; they must never reach a log or a comment.
const (
	giteaToken = "gitea-SECRET-0123456789abcdef"
	planeKey   = "plane_api_SECRET_fedcba9876543210"
	repo       = "acme/widgets"
	planeWS    = "acme"
	planeProj  = "7d0c7e2a-0000-4000-8000-00000000p001"
)

type bundle struct {
	t      *testing.T
	ctx    context.Context
	status *status.Store
	gitea  *trackertest.Gitea
	plane  *trackertest.Plane
	cfg    Config
	logs   *observer.ObservedLogs
	log    *zap.Logger
	js     jetstream.JetStream
	kv     jetstream.KeyValue
}

func setup(t *testing.T) *bundle {
	t.Helper()
	js, kv := natstest.JetStream(t)
	reg, err := registry.Parse([]byte(testkit.RegistryYAML("plane_project: "+planeProj, "plane_workspace: "+planeWS, "agent_user: orch-bot")))
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, ctx: t.Context(), js: js, kv: kv, status: status.New(kv), gitea: trackertest.NewGitea(t, giteaToken, "orch-bot"), plane: trackertest.NewPlane(t, planeKey)}
	b.log, b.logs = logtest.New(t, "SECRET")
	hc := &http.Client{Timeout: 10 * time.Second}
	b.cfg = Config{
		Gitea: NewGitea(b.gitea.URL, giteaToken, hc), Plane: NewPlane(b.plane.URL, planeKey, hc),
		Registry: func() *registry.Registry { return reg }, PublicURL: "https://orch.example.com/",
		QueuedAfter: time.Hour, MinEdit: 100 * time.Millisecond, RetryDelay: 50 * time.Millisecond,
		RetryMaxDelay: 500 * time.Millisecond, RejectedDelay: time.Minute, Lease: 3 * time.Second, Workers: 2,
		Scrubber: scrub.Scrubber{Secrets: []string{giteaToken, planeKey}},
	}
	return b
}

// writer is a writer named name on the bundle's configuration, not yet
// running.
func (b *bundle) writer(name string) *Writer {
	b.t.Helper()
	cfg := b.cfg
	cfg.Name = name
	w, err := New(b.ctx, b.js, b.kv, proto.Topology{}, cfg, b.log)
	if err != nil {
		b.t.Fatal(err)
	}
	return w
}

// start runs a writer named name until the returned stop or the test's end.
func (b *bundle) start(name string) (stop func()) {
	b.t.Helper()
	w := b.writer(name)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.t.Error("writer did not stop")
		}
	}
	b.t.Cleanup(stop)
	return stop
}

// prJob is a review job of pull request pr, whose head is sha.
func (b *bundle) prJob(name string, pr int) *proto.Job {
	sha := fmt.Sprintf("%040x", pr)
	b.gitea.AddPR(repo, pr, sha)
	return &proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID(b.t.Name() + "/" + name), Kind: proto.KindReview, Project: "widgets",
		Task:   proto.Task{ID: fmt.Sprintf("pr-%d", pr), Title: "Make the widget spin", PR: pr},
		Source: proto.Source{System: "gitea"}, CreatedAt: time.Now().UTC(),
	}
}

// set writes the job's status record as a runner would.
func (b *bundle) set(job *proto.Job, f func(*proto.Status)) {
	b.t.Helper()
	statustest.Set(b.t, b.status, job, f)
}

func running(attempt int) func(*proto.Status) {
	return func(s *proto.Status) {
		s.State, s.Attempt, s.MaxAttempts, s.StartedAt = proto.StateRunning, attempt, 3, time.Now().UTC()
		s.Error, s.FinishedAt = "", time.Time{}
	}
}

func retrying(attempt int, why string) func(*proto.Status) {
	return func(s *proto.Status) {
		s.State, s.Attempt, s.Error, s.FinishedAt = proto.StateRetrying, attempt, why, time.Now().UTC()
	}
}

func done(result string) func(*proto.Status) {
	return func(s *proto.Status) {
		s.State, s.Result, s.Turns, s.CostUSD = proto.StateDone, result, 7, 0.42
		s.FinishedAt = s.StartedAt.Add(4*time.Minute + 12*time.Second)
	}
}

// waitComment waits until pull request pr holds exactly one comment whose
// body contains every want, and returns it.
func (b *bundle) waitComment(pr int, want ...string) trackertest.GiteaComment {
	b.t.Helper()
	var got trackertest.GiteaComment
	natstest.CheckFor(b.t, 30*time.Second, 20*time.Millisecond, func() error {
		cs := b.gitea.Comments(repo, pr)
		if len(cs) != 1 {
			return fmt.Errorf("PR %d has %d comments, want 1", pr, len(cs))
		}
		for _, w := range want {
			if !strings.Contains(cs[0].Body, w) {
				return fmt.Errorf("PR %d comment lacks %q:\n%s", pr, w, cs[0].Body)
			}
		}
		got = cs[0]
		return nil
	})
	return got
}

// waitStatus waits until the last commit status on pr's head is state.
func (b *bundle) waitStatus(pr int, state string) []trackertest.GiteaStatus {
	b.t.Helper()
	var got []trackertest.GiteaStatus
	natstest.CheckFor(b.t, 30*time.Second, 20*time.Millisecond, func() error {
		got = b.gitea.Statuses(fmt.Sprintf("%040x", pr))
		if len(got) == 0 || got[len(got)-1].State != state {
			return fmt.Errorf("statuses %+v, want the last %s", got, state)
		}
		return nil
	})
	return got
}

// settle waits until the writer has nothing left for job: its record
// shows the job's current revision.
func (b *bundle) settle(w *Writer, job *proto.Job) {
	b.t.Helper()
	natstest.CheckFor(b.t, 30*time.Second, 20*time.Millisecond, func() error {
		_, rev, err := b.status.Get(b.ctx, job.ID)
		if err != nil {
			return err
		}
		rec, _, err := w.recs.get(b.ctx, job.ID)
		if err != nil {
			return err
		}
		if rec.Rev < rev && rec.Stopped == "" {
			return fmt.Errorf("write-back shows revision %d of %d", rec.Rev, rev)
		}
		return nil
	})
}
