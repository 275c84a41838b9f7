package writeback

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

// agentSetup is the bundle with a project served by a Plane agent app and
// a log whose tail the test writes.
func agentSetup(t *testing.T) (*bundle, *fakeLog) {
	t.Helper()
	b := setup(t)
	reg, err := registry.Parse([]byte(testkit.RegistryYAML("plane_project: "+planeProj, "plane_workspace: "+planeWS, "plane_agent_app: true")))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.Registry = func() *registry.Registry { return reg }
	b.cfg.PlaneRuns = NewPlaneRuns(b.plane.URL, b.plane.BotToken, &http.Client{Timeout: 10 * time.Second})
	b.cfg.ActionEvery = 200 * time.Millisecond
	l := &fakeLog{}
	b.cfg.LogTail = func(context.Context, *proto.Status) string { return l.get() }
	return b, l
}

// fakeLog is the rendered log of the job's attempt, as the runner's
// logstream writes it to JOBS_LOGS.
type fakeLog struct {
	mu sync.Mutex
	s  string
}

func (l *fakeLog) add(line string) { l.mu.Lock(); l.s += line + "\n"; l.mu.Unlock() }
func (l *fakeLog) get() string     { l.mu.Lock(); defer l.mu.Unlock(); return l.s }

func (b *bundle) runJob(run, item string) *proto.Job {
	b.plane.AddItem(planeWS, planeProj, item)
	b.plane.AddRun(planeWS, run, planeProj, item)
	return &proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID(b.t.Name() + "/" + run), Kind: proto.KindRespond, Project: "widgets",
		Task: proto.Task{ID: "wid-41", PlaneItem: item, PlaneRun: run}, Source: proto.Source{System: "plane"}, CreatedAt: time.Now().UTC(),
		Trigger: "please take this one",
	}
}

// waitRun waits until the run's activities have the types want, in order.
func (b *bundle) waitRun(run string, want ...string) []string {
	b.t.Helper()
	var got []string
	natstest.CheckFor(b.t, 30*time.Second, 10*time.Millisecond, func() error {
		rn, _ := b.plane.Run(run)
		got = got[:0]
		for _, a := range rn.Activities {
			got = append(got, a.Type)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("activities %v, want %v", got, want)
		}
		return nil
	})
	return got
}

// A job of a Plane agent run: a thought within a second of being queued
// (a run with no activity goes stale after 5 minutes), an action for each
// new tool call in its log while it runs, at most one every ActionEvery,
// and the response when it is done, which completes the run. No tracking
// comment: the response is the answer in the run's thread.
func TestPlaneAgentRun(t *testing.T) {
	t.Parallel()
	b, log := agentSetup(t)
	b.start("n1")
	job := b.runJob("run-1", "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a3")
	queuedAt := time.Now()
	b.set(job, func(*proto.Status) {})
	b.waitRun("run-1", "thought")
	rn, _ := b.plane.Run("run-1")
	if took := rn.Activities[0].At.Sub(queuedAt); took > time.Second {
		t.Errorf("the thought came %s after the job was queued, want within a second", took)
	}
	if rn.Status != "in_progress" {
		t.Errorf("run status %q after the thought, want in_progress", rn.Status)
	}

	b.set(job, running(1))
	log.add("── session s1: model m, 3 tools, in /work")
	log.add("→ Bash: go test ./...")
	b.waitRun("run-1", "thought", "action")
	log.add("some text")
	log.add("→ Edit: widget.go")
	b.waitRun("run-1", "thought", "action", "action")
	rn, _ = b.plane.Run("run-1")
	if a := rn.Activities[1]; a.Action != "Bash" || a.Parameters["input"] != "go test ./..." {
		t.Errorf("first action %+v, want Bash go test ./...", a)
	}
	if gap := rn.Activities[2].At.Sub(rn.Activities[1].At); gap < b.cfg.ActionEvery {
		t.Errorf("actions %s apart, want at least %s", gap, b.cfg.ActionEvery)
	}

	b.set(job, done("Made the widget <spin>."))
	b.waitRun("run-1", "thought", "action", "action", "response")
	rn, _ = b.plane.Run("run-1")
	if rn.Status != "completed" || !strings.Contains(rn.Activities[3].Body, "Made the widget &lt;spin&gt;.") {
		t.Errorf("run %s with response %q, want completed with the result", rn.Status, rn.Activities[3].Body)
	}
	if cs := b.plane.Comments(job.Task.PlaneItem); len(cs) != 0 {
		t.Errorf("%d tracking comments on a run's item, want none", len(cs))
	}
	for _, r := range b.plane.Requests() {
		if strings.Contains(r.Path, "/runs/") && r.Auth != "Bearer "+b.plane.BotToken {
			t.Errorf("%s %s with %q, want the bot token", r.Method, r.Path, r.Auth)
		}
	}
}

// A run a person stopped: Plane marks it stopping and the gateway cancels
// the job; the job's response then settles the run as stopped. A failed
// job ends its run with an error.
func TestPlaneAgentRunStoppedOrFailed(t *testing.T) {
	t.Parallel()
	b, _ := agentSetup(t)
	b.start("n1")
	stopped := b.runJob("run-stop", "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a4")
	b.set(stopped, running(1))
	b.waitRun("run-stop", "thought")
	b.plane.StopRun("run-stop")
	b.set(stopped, func(s *proto.Status) { s.State = proto.StateCancelled })
	b.waitRun("run-stop", "thought", "response")
	if rn, _ := b.plane.Run("run-stop"); rn.Status != "stopped" {
		t.Errorf("run status %q, want stopped", rn.Status)
	}

	failed := b.runJob("run-fail", "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a5")
	b.set(failed, running(1))
	b.set(failed, func(s *proto.Status) { s.State, s.Error = proto.StateFailed, "agent exited 1" })
	b.waitRun("run-fail", "thought", "error")
	if rn, _ := b.plane.Run("run-fail"); rn.Status != "failed" || !strings.Contains(rn.Activities[1].Body, "agent exited 1") {
		t.Errorf("run %+v, want failed with the error", rn)
	}
}
