package runner_test

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

// SIGHUP reloads the registry: a project added to the file runs after it;
// a broken file, or one naming a template that is missing, is logged with
// its error and the projects loaded before keep running.
//
// The signal goes to the whole test process; it is only sent while this
// test's runner, which handles it, is running (its first job is done), so
// it cannot take the default action of ending the process.
func TestSIGHUPReloadsRegistry(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`echo "$ORCH_PROJECT" >> $RUNS/$ORCH_JOB_ID`))
	cfg.MaxConcurrency = 2
	core, logs := observer.New(zap.InfoLevel)
	e.startLogged(cfg, core)
	first := job("hup-first", "task-1", proto.KindImplement)
	e.enqueue(first)
	e.waitState(first.ID, proto.StateDone, 30*time.Second)

	// hup rewrites the registry with extra appended, sends SIGHUP and
	// waits for the runner to log msg once more than before.
	hup := func(extra, msg string) []observer.LoggedEntry {
		t.Helper()
		before := logs.FilterMessage(msg).Len()
		yaml := fmt.Sprintf("projects:\n  - key: widgets\n    gitea_repo: acme/widgets\n    clone_url: %s\n    default_branch: main\n%s", e.remote, extra)
		if err := os.WriteFile(e.projects, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		var got []observer.LoggedEntry
		natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if got = logs.FilterMessage(msg).All(); len(got) <= before {
				return fmt.Errorf("no new %q logged", msg)
			}
			return nil
		})
		return got[before:]
	}
	gadgets := fmt.Sprintf("  - key: gadgets\n    gitea_repo: acme/gadgets\n    clone_url: %s\n    default_branch: main\n", e.remote)
	const (
		reloaded = "project registry reloaded"
		failed   = "reloading the project registry failed, keeping the old one"
	)
	if got := hup(gadgets, reloaded); got[0].ContextMap()["projects"] != int64(2) {
		t.Errorf("reload logged %v, want 2 projects", got[0].ContextMap())
	}
	// run queues one job per project and waits for all of them to run.
	run := func(name string, projects ...string) {
		t.Helper()
		var jobs []*proto.Job
		for i, project := range projects {
			j := job(fmt.Sprintf("hup-%s-%s", name, project), fmt.Sprint("task-", name, i), proto.KindImplement)
			j.Project = project
			e.enqueue(j)
			jobs = append(jobs, j)
		}
		for _, j := range jobs {
			e.waitState(j.ID, proto.StateDone, 30*time.Second)
			if ran := e.lines(j.ID); len(ran) != 1 || ran[0] != j.Project {
				t.Errorf("job %s ran as %v, want once for %s", j.ID, ran, j.Project)
			}
		}
	}
	run("added", "gadgets")

	for _, c := range []struct{ name, extra, want string }{
		{"broken yaml", gadgets + "  - key: Bad Key\n", "line 10"},
		{"missing template", gadgets + "    templates: {review: nowhere.md}\n", "nowhere.md"},
	} {
		got := hup(c.extra, failed)
		if err := got[0].ContextMap()["error"]; !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("%s: logged error %q, want it to name %q", c.name, err, c.want)
		}
	}
	// Both projects loaded before the bad files still run.
	run("kept", "widgets", "gadgets")
}
