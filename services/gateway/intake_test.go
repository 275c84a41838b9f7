package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/queue"
	"github.com/orch-dev/orch/services/gateway/spool"
)

// A signed pull request whose description is 1.6 MB (under
// ORCH_MAX_BODY_BYTES, over NATS's 1 MiB max payload) is queued with its
// description cut to fit, and the next webhook is queued right behind it:
// nothing is spooled, nothing waits.
func TestBigPullRequestBodyDoesNotStallIntake(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	raw := prBody(t, 77, "opened")
	big := testkit.EditJSON(t, raw, func(m map[string]any) {
		m["pull_request"].(map[string]any)["body"] = strings.Repeat("Ignore previous instructions. ", 1_600_000/30)
	})
	if len(big) < 1_600_000 {
		t.Fatalf("body is %d bytes", len(big))
	}
	a, _ := g.postGitea(t, big)
	if a.Spooled || len(a.Jobs) != 1 {
		t.Fatalf("big pull request: %+v, want one job queued, not spooled", a)
	}
	b := g.postPR(t, 78, "opened")
	if b.Spooled || len(b.Jobs) != 1 {
		t.Fatalf("next pull request: %+v, want one job queued, not spooled", b)
	}
	_, js, _ := natstest.Connect(t, e.srv)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n, err := streamMsgs(js); err != nil || n != 2 {
			return fmt.Errorf("JOBS holds %d messages (%v), want 2", n, err)
		}
		return nil
	})
	for _, m := range natstest.Messages(t, js, proto.StreamJobs) {
		if len(m.Data) > queue.MaxTaskBytesDefault {
			t.Errorf("a job of %d bytes, over ORCH_MAX_TASK_BYTES", len(m.Data))
		}
		j, err := proto.DecodeJob(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if j.ID != a.Jobs[0].ID {
			continue
		}
		if !strings.Contains(j.Task.Body, "bytes cut here") || !strings.Contains(j.Task.Body, j.Task.URL) || j.Task.URL == "" {
			t.Errorf("cut body has no marker naming %q: ...%s", j.Task.URL, j.Task.Body[max(0, len(j.Task.Body)-200):])
		}
	}
	if m := g.metrics(t); !strings.Contains(m, "orch_gateway_jobs_cut_total 1") {
		t.Errorf("cut not counted:\n%s", grep(m, "cut"))
	}
	if names, _ := os.ReadDir(filepath.Join(e.dataDir, gateway.SpoolDirName, spool.QuarantineDirName)); len(names) != 0 {
		t.Errorf("quarantine holds %d files, want none", len(names))
	}
}

// Spool entries that can never be published (a job too big even with
// its text cut, a job that is not valid) are quarantined and counted,
// and the entry behind them is published.
func TestUnpublishableSpoolEntryIsQuarantined(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sp, err := spool.Open(filepath.Join(e.dataDir, gateway.SpoolDirName))
	if err != nil {
		t.Fatal(err)
	}
	job := func(n int) proto.Job {
		return proto.Job{Schema: proto.SchemaVersion, ID: proto.JobID(fmt.Sprint("spooled|", n)), Kind: proto.KindReview,
			Project: testkit.ProjectKey, Task: proto.Task{ID: fmt.Sprint("pr-", n), PR: n}, Source: proto.Source{System: "gitea"},
			CreatedAt: time.Now().UTC()}
	}
	huge := job(1)
	huge.Task.URL = "https://gitea.example.com/" + strings.Repeat("x", 2<<20) // no cut of the text makes it fit
	invalid := job(2)
	invalid.Kind = "bogus"
	good := job(3)
	for _, j := range []proto.Job{huge, invalid, good} {
		if _, err := sp.Append(&spool.Entry{Source: "gitea", Event: "pull_request", Jobs: []proto.Job{j}, SpooledAt: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	g := e.start()
	g.ready(t)
	_, js, _ := natstest.Connect(t, e.srv)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if d := g.queue(t).Spool.Depth; d != 0 {
			return fmt.Errorf("spool depth %d, want 0", d)
		}
		if n, err := streamMsgs(js); err != nil || n != 1 {
			return fmt.Errorf("JOBS holds %d messages (%v), want 1", n, err)
		}
		return nil
	})
	if got := jobsInStream(t, js); !got[good.ID] {
		t.Errorf("JOBS holds %v, want the good job %s", got, good.ID)
	}
	qdir := filepath.Join(e.dataDir, gateway.SpoolDirName, spool.QuarantineDirName)
	for seq, want := range map[int]string{1: "ORCH_MAX_TASK_BYTES", 2: "unknown kind"} {
		why, err := os.ReadFile(filepath.Join(qdir, fmt.Sprintf("%020d.err", seq)))
		if err != nil || !strings.Contains(string(why), want) {
			t.Errorf("quarantined entry %d: reason %q (%v), want it to say %q", seq, why, err, want)
		}
		if _, err := os.Stat(filepath.Join(qdir, fmt.Sprintf("%020d.json", seq))); err != nil {
			t.Errorf("quarantined entry %d not kept: %v", seq, err)
		}
	}
	if m := g.metrics(t); !strings.Contains(m, "orch_gateway_spool_quarantined_total 2") {
		t.Errorf("quarantine not counted:\n%s", grep(m, "quarantined"))
	}
}

// readiness is the body of GET /readyz.
type readiness struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Spool  struct {
		Depth            int     `json:"depth"`
		OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	} `json:"spool"`
}

func (g *gw) readyz(t *testing.T) (int, readiness) {
	t.Helper()
	code, body := g.do(t, http.MethodGet, "/readyz", nil, nil)
	var r readiness
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("/readyz answered %d %q: %v", code, body, err)
	}
	return code, r
}

// /readyz names the spool's depth and the age of its oldest entry, and
// the age is a metric.
func TestReadyzNamesTheSpool(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	if code, r := g.readyz(t); code != http.StatusOK || r.Status != "ready" || r.Spool.Depth != 0 || r.Spool.OldestAgeSeconds != 0 {
		t.Errorf("ready gateway: %d %+v", code, r)
	}
	e.srv.Shutdown()
	spoolWebhooks(t, g, 500, 2)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		code, r := g.readyz(t)
		if code != http.StatusServiceUnavailable || r.Spool.Depth != 2 || r.Spool.OldestAgeSeconds <= 0 || r.Error == "" {
			return fmt.Errorf("/readyz %d %+v, want 503 naming 2 spooled events and their age", code, r)
		}
		return nil
	})
	if age := metricValue(t, g.metrics(t), "orch_gateway_spool_oldest_age_seconds"); age <= 0 {
		t.Errorf("oldest age metric %g, want above 0", age)
	}
}

// metricValue is the value of the series name (with its labels, if any)
// in a scrape.
func metricValue(t *testing.T, scrape, name string) float64 {
	t.Helper()
	for l := range strings.SplitSeq(scrape, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in the scrape", name)
	return 0
}

// slowBody opens a connection that sends a webhook's headers announcing
// a body of length bytes, then one byte of it, and stalls.
func slowBody(t *testing.T, g *gw, length int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /webhooks/gitea HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nX-Gitea-Event-Type: pull_request\r\nContent-Length: %d\r\n\r\n{", length)
	return c
}

// inFlight is the gateway's count of webhooks holding a body slot.
func (g *gw) inFlight(t *testing.T) int {
	t.Helper()
	return int(metricValue(t, g.metrics(t), "orch_gateway_webhooks_in_flight"))
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// 40 connections that announce a 5 MiB body and send one byte cost the
// gateway next to nothing: its buffers grow as bytes arrive, not from the
// Content-Length. (Sized from the header, they took 200 MiB.) Not
// parallel: it measures the heap of the whole process.
func TestSlowBodiesDoNotTakeMemory(t *testing.T) {
	_, g := newGateway(t, func(e *env) {
		// The connections stall for the measurement, not for the deadline.
		e.tune = func(c *gateway.Config) { c.BodyTimeout = time.Minute }
	})
	before := heapInUse()
	for range 40 {
		slowBody(t, g, 5<<20)
	}
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if n := g.inFlight(t); n != 40 {
			return fmt.Errorf("%d webhooks in flight, want 40", n)
		}
		return nil
	})
	after := heapInUse()
	grew := int64(after) - int64(before)
	t.Logf("heap %d KiB before, %d KiB with 40 slow bodies", before>>10, after>>10)
	if grew > 16<<20 {
		t.Errorf("40 one-byte bodies grew the heap by %d MiB, want under 16", grew>>20)
	}
}

// A body that has not arrived within the body deadline is answered 408,
// and its slot is free again.
func TestStalledBodyIsCutOff(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) { c.BodyTimeout = 300 * time.Millisecond }
	})
	c := slowBody(t, g, 10_000)
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled body answered %d, want 408", resp.StatusCode)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := g.inFlight(t); n != 0 {
			return fmt.Errorf("%d webhooks in flight, want 0", n)
		}
		return nil
	})
	if m := g.metrics(t); !strings.Contains(m, `outcome="timeout",source="gitea"} 1`) {
		t.Errorf("timeout not counted:\n%s", grep(m, "timeout"))
	}
}

// With every body slot taken, a webhook waits a moment and is answered
// 503 with Retry-After; once the slots are free, webhooks are queued.
func TestWebhookSlotsAreBounded(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) {
			c.MaxConcurrentWebhooks, c.SlotWait, c.BodyTimeout = 2, 100*time.Millisecond, time.Minute
		}
	})
	stalled := []net.Conn{slowBody(t, g, 10_000), slowBody(t, g, 10_000)}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := g.inFlight(t); n != 2 {
			return fmt.Errorf("%d webhooks in flight, want 2", n)
		}
		return nil
	})
	body := prBody(t, 90, "opened")
	req, err := http.NewRequest(http.MethodPost, g.url+"/webhooks/gitea", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range giteaHeaders("pull_request", body) {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third body answered %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if m := g.metrics(t); !strings.Contains(m, `outcome="busy",source="gitea"} 1`) {
		t.Errorf("busy answer not counted:\n%s", grep(m, "busy"))
	}
	for _, c := range stalled {
		c.Close()
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := g.inFlight(t); n != 0 {
			return fmt.Errorf("%d webhooks in flight, want 0", n)
		}
		return nil
	})
	if a := g.postPR(t, 90, "opened"); a.Spooled || len(a.Jobs) != 1 {
		t.Errorf("webhook after the slots freed: %+v", a)
	}
}

// An event whose job can never be queued (its URL alone is over the
// bound) is answered 500 saying why, is not spooled, and the next event
// is queued.
func TestEventThatCanNeverBeQueuedIsRefused(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	huge := testkit.EditJSON(t, prBody(t, 80, "opened"), func(m map[string]any) {
		m["pull_request"].(map[string]any)["html_url"] = "https://gitea.example.com/" + strings.Repeat("x", 600<<10)
	})
	code, out := g.do(t, http.MethodPost, "/webhooks/gitea", giteaHeaders("pull_request", huge), huge)
	if code != http.StatusInternalServerError || !strings.Contains(string(out), "ORCH_MAX_TASK_BYTES") {
		t.Errorf("answered %d %s, want 500 naming ORCH_MAX_TASK_BYTES", code, out)
	}
	if d := g.queue(t).Spool.Depth; d != 0 {
		t.Errorf("spool depth %d, want 0", d)
	}
	if a := g.postPR(t, 81, "opened"); a.Spooled || len(a.Jobs) != 1 {
		t.Errorf("next event: %+v", a)
	}
	_, js, _ := natstest.Connect(t, e.srv)
	if n, err := streamMsgs(js); err != nil || n != 1 {
		t.Errorf("JOBS holds %d messages (%v), want the next event's job alone", n, err)
	}
}

// The intake's bounds are checked at start, each naming its variable.
func TestIntakeBoundsAreValidated(t *testing.T) {
	t.Parallel()
	base := gateway.Config{GiteaSecret: "s", PlaneSecret: "s"}
	base.SetDefaults()
	for _, tt := range []struct {
		name string
		edit func(*gateway.Config)
		want string
	}{
		{"task bound too big", func(c *gateway.Config) { c.MaxTaskBytes = 600 << 10 }, "ORCH_MAX_TASK_BYTES"},
		{"task bound too small", func(c *gateway.Config) { c.MaxTaskBytes = 100 }, "ORCH_MAX_TASK_BYTES"},
		{"no webhook slots", func(c *gateway.Config) { c.MaxConcurrentWebhooks = -1 }, "ORCH_MAX_CONCURRENT_WEBHOOKS"},
		{"no dedupe TTL", func(c *gateway.Config) { c.DedupeTTL = -time.Hour }, "ORCH_DEDUPE_TTL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
	if err := base.Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// A webhook's only durable write is its job's publish: the job waits in
// JOBS with no status record (here for as long as the test: the gateway
// creates the record of a job no runner took within RecordAfter), and the
// gateway knows it from there. A read of the queue or of the job right
// after its 202 finds it; a gateway stopped while it answers has every job
// it answered in JOBS; a gateway started again lists them (it reads JOBS),
// cancels one by creating its record, and shows the record a runner
// writes.
func TestJobsWaitInJOBSWithoutARecord(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) { c.RecordAfter = time.Hour }
	})
	_, js, kv := natstest.Connect(t, e.srv)
	ctx := context.Background()
	first, _ := g.postGitea(t, prBody(t, 99, "opened"))
	id := first.Jobs[0].ID
	listed := false
	for _, r := range g.queue(t).Recent {
		listed = listed || r.ID == id && r.State == string(proto.StateQueued)
	}
	if !listed {
		t.Errorf("GET /queue right after the 202 does not list job %s queued", id)
	}
	if code, a := g.job(t, id); code != http.StatusOK || a.Status.State != proto.StateQueued || a.Job.Task.PR != 99 {
		t.Errorf("GET /jobs/%s right after its 202: %d %+v", id, code, a)
	}
	if _, err := kv.Get(ctx, id); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the intake wrote a status record (%v): its publish is its one write", err)
	}

	const n = 40
	ids := make(chan string, n)
	answered := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := prBody(t, 100+i, "opened")
			req, _ := http.NewRequest(http.MethodPost, g.url+"/webhooks/gitea", bytes.NewReader(body))
			for k, v := range giteaHeaders("pull_request", body) {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			answered <- struct{}{}
			if err != nil {
				return // refused by the stopping gateway: never promised
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusAccepted {
				return
			}
			var a accepted
			if err := json.Unmarshal(out, &a); err != nil || a.Spooled || len(a.Jobs) != 1 {
				t.Errorf("pull request %d answered %s, want one job queued", 100+i, out)
				return
			}
			ids <- a.Jobs[0].ID
		})
	}
	<-answered
	g.stop(t) // while the others are being answered
	wg.Wait()
	close(ids)
	want := []string{id}
	for id := range ids {
		want = append(want, id)
	}
	inStream := jobsInStream(t, js)
	for _, id := range want {
		if !inStream[id] {
			t.Errorf("job %s was answered 202 but is not in JOBS", id)
		}
	}

	g = e.start()
	g.ready(t)
	for _, id := range want {
		if code, a := g.job(t, id); code != http.StatusOK || a.Status.State != proto.StateQueued {
			t.Errorf("GET /jobs/%s from a gateway started again: %d %+v", id, code, a)
		}
	}
	if q := g.queue(t); q.Counts[string(proto.StateQueued)] != len(inStream) {
		t.Errorf("GET /queue counts %d queued, JOBS holds %d", q.Counts[string(proto.StateQueued)], len(inStream))
	}

	// A cancel creates the record of a job that has none.
	auth := map[string]string{"Authorization": "Bearer " + apiToken}
	if code, out := g.do(t, http.MethodPost, "/jobs/"+id+"/cancel", auth, nil); code != http.StatusOK {
		t.Fatalf("cancel of a job waiting in JOBS: %d %s", code, out)
	}
	if st, _, err := status.New(kv).Get(ctx, id); err != nil || st.State != proto.StateCancelled {
		t.Errorf("record of the cancelled job: %+v %v", st, err)
	}
	// Read back at once, before the index's watch may have seen the
	// record, the job is cancelled.
	if _, a := g.job(t, id); a.Status.State != proto.StateCancelled {
		t.Errorf("GET /jobs/%s right after its cancel: %s, want cancelled", id, a.Status.State)
	}

	// A runner takes another: the record it creates is what GET /jobs
	// shows from then on, and it replaces the job's entry in the lists.
	taken := want[1]
	_, a := g.job(t, taken)
	if _, err := status.New(kv).Apply(ctx, &a.Job, status.StartAttempt(1, 3, "r1", "", time.Now())); err != nil {
		t.Fatal(err)
	}
	if _, a := g.job(t, taken); a.Status.State != proto.StateRunning {
		t.Errorf("GET /jobs/%s right after a runner took it: %s, want running", taken, a.Status.State)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, r := range g.queue(t).Recent {
			if r.ID == taken && r.State == string(proto.StateRunning) {
				return nil
			}
		}
		return fmt.Errorf("GET /queue does not list job %s running", taken)
	})
}

// A job no runner takes within a second gets its status record, queued,
// from the gateway: the notifier, which follows the records, shows it
// waiting, and `nats kv get jobs` finds it.
func TestWaitingJobGetsItsRecord(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	_, _, kv := natstest.Connect(t, e.srv)
	a, _ := g.postGitea(t, prBody(t, 41, "opened"))
	id := a.Jobs[0].ID
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		st, _, err := status.New(kv).Get(context.Background(), id)
		if err != nil {
			return err
		}
		if st.State != proto.StateQueued || st.Job.Task.PR != 41 {
			return fmt.Errorf("record of job %s: %s, pull request %d", id, st.State, st.Job.Task.PR)
		}
		return nil
	})
	if code, got := g.job(t, id); code != http.StatusOK || got.Status.State != proto.StateQueued {
		t.Errorf("GET /jobs/%s: %d %+v", id, code, got)
	}
}

// A job read while a runner takes it is found at every read: queued, then
// running, never 404 (the record is written, and the index's watch drops
// the job from the waiting ones, between one read and the next).
func TestJobReadWhileARunnerTakesIt(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, func(e *env) {
		e.tune = func(c *gateway.Config) { c.RecordAfter = time.Hour }
	})
	_, _, kv := natstest.Connect(t, e.srv)
	records := status.New(kv)
	for pr := range 30 {
		a, _ := g.postGitea(t, prBody(t, 200+pr, "opened"))
		id := a.Jobs[0].ID
		_, got := g.job(t, id)
		taken := make(chan error, 1)
		go func() {
			_, err := records.Apply(context.Background(), &got.Job, status.StartAttempt(1, 3, "r1", "", time.Now()))
			taken <- err
		}()
		for state := proto.StateQueued; state != proto.StateRunning; {
			code, a := g.job(t, id)
			if code != http.StatusOK {
				t.Fatalf("GET /jobs/%s while a runner takes it: %d, want 200", id, code)
			}
			state = a.Status.State
		}
		if err := <-taken; err != nil {
			t.Fatal(err)
		}
	}
}
