package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// twoProjects rewrites the env's registry to serve widgets (with
// widgetsExtra) and gadgets, both from the env's remote.
func (e *env) twoProjects(widgetsExtra string) {
	e.t.Helper()
	yaml := "projects:\n"
	for _, p := range []struct{ key, extra string }{{"widgets", widgetsExtra}, {"gadgets", ""}} {
		yaml += fmt.Sprintf("  - key: %s\n    gitea_repo: acme/%s\n    clone_url: %s\n    default_branch: main\n%s", p.key, p.key, e.remote, p.extra)
	}
	if err := os.WriteFile(e.projects, []byte(yaml), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// span is one run of a trackedAgent: when it started and ended (0 while
// it runs), by the agent's clock.
type span struct {
	job        string
	start, end int64
}

// spans reads the runs of trackedAgent agents, the earliest start first.
func (e *env) spans() []span {
	files, _ := filepath.Glob(filepath.Join(e.runs, "run.*"))
	var out []span
	for _, f := range files {
		data, _ := os.ReadFile(f)
		s := span{job: strings.Split(filepath.Base(f), ".")[1]}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "start "); ok {
				s.start, _ = strconv.ParseInt(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(line, "end "); ok {
				s.end, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// overlap is the most spans of the jobs in of open at once (all spans
// when of is nil).
func overlap(spans []span, of map[string]bool) int {
	type event struct {
		at    int64
		delta int
	}
	var events []event
	for _, s := range spans {
		if of == nil || of[s.job] {
			events = append(events, event{s.start, +1}, event{s.end, -1})
		}
	}
	sort.Slice(events, func(i, j int) bool {
		if events[i].at != events[j].at {
			return events[i].at < events[j].at
		}
		return events[i].delta < events[j].delta
	})
	cur, most := 0, 0
	for _, ev := range events {
		cur += ev.delta
		most = max(most, cur)
	}
	return most
}

// startedBefore counts the spans of the jobs in of that started before
// job's first run did.
func startedBefore(spans []span, job string, of map[string]bool) int {
	var at int64
	for _, s := range spans {
		if s.job == job {
			at = s.start
			break
		}
	}
	n := 0
	for _, s := range spans {
		if of[s.job] && s.start < at {
			n++
		}
	}
	return n
}

// waitRunning waits until n of ids are running.
func (e *env) waitRunning(ids []string, n int) {
	e.t.Helper()
	natstest.CheckFor(e.t, 30*time.Second, 20*time.Millisecond, func() error {
		running := 0
		for _, s := range e.spans() {
			if s.end == 0 && slices.Contains(ids, s.job) {
				running++
			}
		}
		if running < n {
			return fmt.Errorf("%d of the jobs running, want %d", running, n)
		}
		return nil
	})
}

func set(ids []string) map[string]bool {
	m := map[string]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// Two projects share ORCH_MAX_CONCURRENCY=2. widgets queues 10 jobs of a
// second and a half; once two run, gadgets queues one: it starts when the
// next slot frees, not after widgets' backlog (on the old code, 10 widgets
// jobs started before it).
func TestFairShareAcrossProjects(t *testing.T) {
	e := newEnv(t, "")
	e.twoProjects("")
	cfg := e.config("r1", e.script("SLEEP=1.5\n"+trackedAgent))
	cfg.MaxConcurrency = 2
	e.start(cfg)
	var widgets []string
	for i := range 10 {
		j := job(fmt.Sprint("fair-w", i), fmt.Sprint("task-w", i), proto.KindImplement)
		widgets = append(widgets, j.ID)
		e.enqueue(j)
	}
	e.waitRunning(widgets, 2)
	g := job("fair-g", "task-g", proto.KindImplement)
	g.Project = "gadgets"
	e.enqueue(g)
	e.waitState(g.ID, proto.StateDone, 60*time.Second)
	for _, id := range widgets {
		e.waitState(id, proto.StateDone, 60*time.Second)
	}
	e.waitStreamEmpty(10 * time.Second)
	spans := e.spans()
	// The two running when it came, and one beside it if both ended at
	// once: it takes the first slot that frees.
	if n := startedBefore(spans, g.ID, set(widgets)); n > 3 {
		t.Errorf("%d widgets jobs started before gadgets' job, want 2 or 3 (it takes the next free slot)", n)
	}
	if n := overlap(spans, nil); n > 2 {
		t.Errorf("%d agents at once, over ORCH_MAX_CONCURRENCY=2", n)
	}
}

// widgets has max_concurrency: 1 and 5 jobs, gadgets 5 jobs; two runners
// share ORCH_MAX_CONCURRENCY=2: never two widgets agents at once, and the
// other slot serves gadgets meanwhile.
func TestProjectLimitAcrossRunners(t *testing.T) {
	e := newEnv(t, "")
	e.twoProjects("    max_concurrency: 1\n")
	// The first agents wait (30 s at most) until two runs have started, so
	// that both slots are busy at once however slowly a loaded machine
	// starts them (0.7 s agents started far apart never overlapped); the
	// later ones do not wait.
	agentCmd := e.script("SLEEP=0.7\n" + `touch $RUNS/began.$ORCH_JOB_ID.$ORCH_ATTEMPT
i=0
while [ "$(ls $RUNS | grep -c '^began\.')" -lt 2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
` + trackedAgent)
	for _, name := range []string{"r1", "r2"} {
		cfg := e.config(name, agentCmd)
		cfg.MaxConcurrency = 2
		e.start(cfg)
	}
	var widgets, gadgets []string
	for i := range 5 {
		w := job(fmt.Sprint("limit-w", i), fmt.Sprint("task-w", i), proto.KindImplement)
		widgets = append(widgets, w.ID)
		e.enqueue(w)
	}
	for i := range 5 {
		g := job(fmt.Sprint("limit-g", i), fmt.Sprint("task-g", i), proto.KindImplement)
		g.Project = "gadgets"
		gadgets = append(gadgets, g.ID)
		e.enqueue(g)
	}
	for _, id := range append(append([]string(nil), widgets...), gadgets...) {
		e.waitState(id, proto.StateDone, 90*time.Second)
	}
	e.waitStreamEmpty(10 * time.Second)
	spans := e.spans()
	if n := overlap(spans, set(widgets)); n != 1 {
		t.Errorf("%d widgets agents at once, want 1 (max_concurrency: 1)", n)
	}
	if n := overlap(spans, nil); n != 2 {
		t.Errorf("%d agents at once at most, want 2: the other slot serves gadgets", n)
	}
	if len(spans) != 10 {
		t.Errorf("%d runs, want 10", len(spans))
	}
}

// A mention (respond, high priority) queued behind 10 fix jobs (normal)
// of its own project starts next.
func TestMentionStartsBeforeAutomaticWork(t *testing.T) {
	e := newEnv(t, "")
	e.start(e.config("r1", e.script("SLEEP=0.5\n"+trackedAgent)))
	var fixes []string
	for i := range 10 {
		j := job(fmt.Sprint("prio-fix", i), fmt.Sprint("task-f", i), proto.KindFix)
		j.Source.System = "gitea"
		fixes = append(fixes, j.ID)
		e.enqueue(j)
	}
	e.waitRunning(fixes, 1)
	m := job("prio-mention", "task-m", proto.KindRespond)
	m.Trigger = "@agent please look"
	e.enqueue(m)
	e.waitState(m.ID, proto.StateDone, 60*time.Second)
	for _, id := range fixes {
		e.waitState(id, proto.StateDone, 60*time.Second)
	}
	e.waitStreamEmpty(10 * time.Second)
	if n := startedBefore(e.spans(), m.ID, set(fixes)); n != 1 {
		t.Errorf("%d fix jobs started before the mention, want 1 (the one running when it came)", n)
	}
}

// An operator's pause (the pauses bucket's project.<key>, as POST
// /projects/{key}/pause writes it): the project's jobs are held (reason
// operator), the pause holds across a restart of the runner and of
// JetStream, and its jobs run once it is lifted.
func TestPausedProjectHoldsItsJobsAcrossRestarts(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	pauses, err := e.js.KeyValue(ctx, proto.BucketPauses)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(proto.Pause{Schema: proto.SchemaVersion, Reason: proto.HoldOperator, Since: time.Now().UTC(), By: "test"})
	if _, err := pauses.Put(ctx, proto.ProjectPauseKey("widgets"), data); err != nil {
		t.Fatal(err)
	}
	agentCmd := e.script("SLEEP=0.1\n" + trackedAgent)
	stop := e.start(e.config("r1", agentCmd))
	j1 := job("paused-1", "task-p1", proto.KindImplement)
	e.enqueue(j1)
	if st := e.waitState(j1.ID, proto.StateHeld, 20*time.Second); st.HeldReason != proto.HoldOperator {
		t.Errorf("held for %q, want %q", st.HeldReason, proto.HoldOperator)
	}

	// Every service restarts: the runner and JetStream.
	stop()
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	e.start(e.config("r2", agentCmd))
	j2 := job("paused-2", "task-p2", proto.KindImplement)
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		data, _ := json.Marshal(j2)
		_, err := e.js.Publish(ctx, proto.JobSubject(j2.Project, j2.Kind), data, jetstream.WithMsgID(j2.ID))
		return err
	})
	if _, err := e.status.Apply(ctx, j2, status.Queue(0)); err != nil {
		t.Fatal(err)
	}
	e.waitState(j2.ID, proto.StateHeld, 20*time.Second)
	if st, _, err := e.status.Get(ctx, j1.ID); err != nil || st.State != proto.StateHeld {
		t.Fatalf("first job after the restart: %v %v, want held", st, err)
	}
	if len(e.spans()) != 0 {
		t.Fatalf("a paused project's job ran: %v", e.spans())
	}

	// Resume: both run.
	if err := pauses.Delete(ctx, proto.ProjectPauseKey("widgets")); err != nil {
		t.Fatal(err)
	}
	e.waitState(j1.ID, proto.StateDone, 30*time.Second)
	e.waitState(j2.ID, proto.StateDone, 30*time.Second)
	e.waitStreamEmpty(10 * time.Second)
}
