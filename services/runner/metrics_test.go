package runner_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/metricstest"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
)

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	code, _ := metricstest.Get(url)
	return code
}

// TestMetrics runs a success, a failure, a job of an unknown project and
// one of an unknown kind, and checks what an operator scrapes: outcomes by
// kind, project and outcome, Claude Code's cost and turns, the duration
// histograms, and label values that never come from a job's payload.
func TestMetrics(t *testing.T) {
	e := newEnv(t, "")
	ok, _ := filepath.Abs("agent/testdata/claude-stream.jsonl")
	cfg := e.config("r1", e.script(fmt.Sprintf(`case "$ORCH_TASK" in good) cat %q;; *) exit 3;; esac`, ok)))
	cfg.MaxAttempts = 2
	ln := testkit.Listen(t)
	cfg.Listener = ln
	base := "http://" + ln.Addr().String()
	e.start(cfg)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code := httpStatus(t, base+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz = %d", code)
		}
		return nil
	})

	good, failing := job("m-good", "good", proto.KindReview), job("m-bad", "bad", proto.KindFix)
	stranger := job("m-stranger", "good", proto.KindReview)
	stranger.Project = "not-in-registry"
	oddKind := job("m-odd", "good", proto.Kind("payload-kind"))
	for _, j := range []*proto.Job{good, failing, stranger, oddKind} {
		e.enqueue(j)
	}
	e.waitState(good.ID, proto.StateDone, 30*time.Second)
	e.waitState(failing.ID, proto.StateFailed, 30*time.Second)
	e.waitState(stranger.ID, proto.StateFailed, 30*time.Second)
	e.waitState(oddKind.ID, proto.StateFailed, 30*time.Second)

	var m *metricstest.Exposition
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		m = metricstest.Scrape(t, base+"/metrics")
		// The settles are counted after the status write the test saw.
		if n := len(m.Series("orch_runner_jobs_finished_total")); n < 5 {
			return fmt.Errorf("%d finished series", n)
		}
		return nil
	})
	m.Lint(t)
	want := map[string]float64{
		`orch_runner_jobs_finished_total{kind="review",outcome="done",project="widgets"}`:   1,
		`orch_runner_jobs_finished_total{kind="fix",outcome="retry",project="widgets"}`:     1,
		`orch_runner_jobs_finished_total{kind="fix",outcome="failed",project="widgets"}`:    1,
		`orch_runner_jobs_finished_total{kind="review",outcome="failed",project="unknown"}`: 1,
		`orch_runner_cost_usd_total{kind="review",project="widgets"}`:                       0.18374925,
		`orch_runner_agent_turns_total{kind="review",project="widgets"}`:                    7,
		`orch_runner_agent_exits_total{code="3"}`:                                           2,
		`orch_runner_agents_running`:                                                        0,
		`orch_runner_consumer_bound`:                                                        1,
		`orch_runner_agent_duration_seconds_count{kind="fix"}`:                              2,
		`orch_runner_queue_wait_seconds_count{kind="fix"}`:                                  1,
		`orch_runner_job_duration_seconds_count{kind="review",outcome="done"}`:              1,
	}
	for series, v := range want {
		if got, ok := m.Value(series); !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	if got, _ := m.Value(`orch_runner_worktree_prepare_seconds_count`); got < 3 {
		t.Errorf("worktree preparations counted %v, want at least 3", got)
	}
	// Jobs that name projects and kinds out of any list add no series:
	// after a first batch has made the "unknown" ones, a second, larger
	// batch leaves the count as it is.
	orchSeries := func(m *metricstest.Exposition) int {
		n := 0
		for name := range m.Samples {
			if strings.HasPrefix(name, "orch_") {
				n++
			}
		}
		return n
	}
	strangers := func(n int) {
		var ids []string
		for i := range n {
			j := job(fmt.Sprintf("m-rand-%d-%d", n, i), "good", proto.Kind(fmt.Sprintf("kind-%d-%d", n, i)))
			j.Project = fmt.Sprintf("project-%d-%d", n, i)
			e.enqueue(j)
			ids = append(ids, j.ID)
		}
		for _, id := range ids {
			e.waitState(id, proto.StateFailed, 30*time.Second)
		}
		// The settle is counted just after the status write seen above.
		natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			got, _ := metricstest.Scrape(t, base+"/metrics").Value(`orch_runner_jobs_finished_total{kind="unknown",outcome="failed",project="unknown"}`)
			if int(got) < n {
				return fmt.Errorf("%v jobs of unknown kinds counted, want at least %d", got, n)
			}
			return nil
		})
	}
	strangers(3)
	before := orchSeries(metricstest.Scrape(t, base+"/metrics"))
	strangers(30)
	m = metricstest.Scrape(t, base+"/metrics")
	if after := orchSeries(m); after != before {
		t.Errorf("30 jobs of unknown projects and kinds took the orch_ series from %d to %d", before, after)
	}
	for _, label := range []string{"kind", "project"} {
		for _, v := range m.LabelValues("orch_runner_jobs_finished_total", label) {
			if !slices.Contains([]string{"review", "fix", "widgets", "unknown"}, v) {
				t.Errorf("label %s=%q comes from a job's payload, not the registry or proto's kinds", label, v)
			}
		}
	}
}

// TestHTTPAddrFromEnvironment pins the runner's default address, which
// the Kubernetes probes and the scrape configuration name.
func TestHTTPAddrFromEnvironment(t *testing.T) {
	t.Setenv("ORCH_HTTP_ADDR", "")
	var cfg runner.Config
	if err := service.FromEnv(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPAddr != ":8081" {
		t.Errorf("ORCH_HTTP_ADDR defaults to %q, want %q", cfg.HTTPAddr, ":8081")
	}
}

// TestProbes checks the probes a platform asks: /healthz while the
// process serves, /readyz only once NATS answers and the consumer is
// bound, and no listener left behind once Run returns.
func TestProbes(t *testing.T) {
	e := newEnv(t, "")
	cfg := e.config("r1", e.script(`exit 0`))
	// A NATS server that is not there yet: the listener is up, not ready.
	dead := testkit.Listen(t)
	cfg.NATSURL = "nats://" + dead.Addr().String()
	dead.Close()
	ln := testkit.Listen(t)
	cfg.Listener = ln
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx, cfg, zaptest.NewLogger(t)) }()
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code := httpStatus(t, base+"/healthz"); code != http.StatusOK {
			return fmt.Errorf("/healthz = %d", code)
		}
		return nil
	})
	if code := httpStatus(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz without NATS = %d, want 503", code)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want it cancelled", err)
	}
	if code := httpStatus(t, base+"/healthz"); code != 0 {
		t.Errorf("/healthz after Run returned = %d, want the listener closed", code)
	}

	// With NATS: ready once the consumer is bound.
	cfg = e.config("r2", e.script(`exit 0`))
	ln = testkit.Listen(t)
	cfg.Listener = ln
	base = "http://" + ln.Addr().String()
	e.start(cfg)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code := httpStatus(t, base+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz = %d", code)
		}
		return nil
	})
}
