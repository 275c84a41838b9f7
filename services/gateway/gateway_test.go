package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

const (
	giteaSecret  = "fixture-secret"
	planeSecret  = "plane_wh_5f1c0d6b8e2a4c7f9b3d1e0a6c8b2f47"
	planeProject = "22b6fc9c-1849-45da-b103-52a3e3a6b4c1"
	apiToken     = "t0ken"
)

const registryYAML = `projects:
  - key: widgets
    gitea_repo: acme/widgets
    plane_project: ` + planeProject + `
    mention: "@agent-bot"
    agent_user: agent-bot
    trusted_actors: [alice, bob, alice@example.com]
`

// gw is one running gateway.
type gw struct {
	url    string
	cancel context.CancelFunc
	done   chan error
}

type env struct {
	t        *testing.T
	srv      *embedded.Server
	dataDir  string
	projects string
	token    string
	maxBody  service.ByteSize
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, srv: natstest.Server(t), dataDir: dir, projects: filepath.Join(dir, "projects.yaml"), token: apiToken}
	e.writeRegistry(registryYAML)
	return e
}

func (e *env) writeRegistry(yaml string) {
	e.t.Helper()
	if err := os.WriteFile(e.projects, []byte(yaml), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// start runs a gateway against e's server and data dir until stop or the
// end of the test.
func (e *env) start() *gw {
	t := e.t
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gw{url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	cfg := gateway.Config{
		Common:   service.Common{NATSURL: e.srv.URL(), DataDir: e.dataDir},
		Listener: ln, ProjectsFile: e.projects, GiteaSecret: giteaSecret, PlaneSecret: planeSecret,
		APIToken: e.token, MaxBodyBytes: e.maxBody,
	}
	log := zaptest.NewLogger(t)
	go func() { g.done <- gateway.Run(ctx, cfg, log) }()
	t.Cleanup(func() { g.stop(t) })
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get(g.url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	return g
}

// stop stops the gateway and waits until Run has returned.
func (g *gw) stop(t *testing.T) {
	t.Helper()
	if g.cancel == nil {
		return
	}
	g.cancel()
	g.cancel = nil
	select {
	case err := <-g.done:
		if err != nil {
			t.Errorf("gateway.Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("gateway did not stop")
	}
}

// ready waits until the gateway is connected and its job index read.
func (g *gw) ready(t *testing.T) {
	t.Helper()
	testkit.Ready(t, nil, g.url, 30*time.Second)
}

func (g *gw) do(t *testing.T, method, path string, headers map[string]string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, g.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// read GETs path with the API token, as an operator would.
func (g *gw) read(t *testing.T, path string) (int, []byte) {
	t.Helper()
	return g.do(t, http.MethodGet, path, map[string]string{"Authorization": "Bearer " + apiToken}, nil)
}

func readFixture(t *testing.T, name string) ([]byte, map[string]string) {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", name+".headers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]string
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	return body, h
}

// prBody is the pull request fixture as pull request number n and action.
func prBody(t *testing.T, n int, action string) []byte {
	t.Helper()
	raw, _ := readFixture(t, "gitea/pull_request__opened")
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["number"], m["action"] = n, action
	pr := m["pull_request"].(map[string]any)
	pr["number"] = n
	if action == "closed" {
		pr["state"], pr["closed_at"] = "closed", "2025-06-02T12:00:00Z"
	}
	out, _ := json.Marshal(m)
	return out
}

func giteaHeaders(event string, body []byte) map[string]string {
	return map[string]string{
		"Content-Type": "application/json", webhook.GiteaEventType: event,
		webhook.GiteaSignature: webhook.Sign(giteaSecret, body), webhook.GiteaDelivery: fmt.Sprint(time.Now().UnixNano()),
	}
}

// accepted is a 202 webhook answer.
type accepted struct {
	Jobs []struct {
		ID, Kind, Project, Task string
	} `json:"jobs"`
	Cancel *struct {
		Project, Task string
	} `json:"cancel"`
	Spooled bool `json:"spooled"`
}

func (g *gw) postPR(t *testing.T, n int, action string) accepted {
	t.Helper()
	body := prBody(t, n, action)
	code, out := g.do(t, http.MethodPost, "/webhooks/gitea", giteaHeaders("pull_request", body), body)
	if code != http.StatusAccepted {
		t.Fatalf("webhook answered %d %s, want 202", code, out)
	}
	var a accepted
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// jobsInStream reads every message of JOBS and fails on a job id seen
// twice.
func jobsInStream(t *testing.T, js jetstream.JetStream) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for _, m := range natstest.Messages(t, js, proto.StreamJobs) {
		j, err := proto.DecodeJob(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if ids[j.ID] {
			t.Errorf("job %s is in JOBS twice", j.ID)
		}
		ids[j.ID] = true
	}
	return ids
}

func streamMsgs(js jetstream.JetStream) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

type queueAnswer struct {
	Counts map[string]int `json:"counts"`
	Stream *struct {
		Messages uint64 `json:"messages"`
	} `json:"stream"`
	Consumer *struct {
		Pending uint64 `json:"pending"`
	} `json:"consumer"`
	Spool struct {
		Depth int `json:"depth"`
	} `json:"spool"`
	Recent []struct {
		ID, Kind, Project, Task, State string
		Attempt                        int
		UpdatedAt                      time.Time `json:"updated_at"`
	} `json:"recent"`
}

func (g *gw) queue(t *testing.T) queueAnswer {
	t.Helper()
	code, body := g.read(t, "/queue?limit=100")
	if code != http.StatusOK {
		t.Fatalf("GET /queue: %d %s", code, body)
	}
	var q queueAnswer
	if err := json.Unmarshal(body, &q); err != nil {
		t.Fatal(err)
	}
	return q
}

// spoolWebhooks sends n distinct pull requests, numbered from first, while
// JetStream is down: each must be answered 202 and spooled.
func spoolWebhooks(t *testing.T, g *gw, first, n int) []string {
	t.Helper()
	var ids []string
	for i := first; i < first+n; i++ {
		a := g.postPR(t, i, "opened")
		if !a.Spooled || len(a.Jobs) != 1 {
			t.Fatalf("webhook %d: %+v, want one spooled job", i, a)
		}
		ids = append(ids, a.Jobs[0].ID)
	}
	return ids
}

// waitJobs waits until JOBS holds exactly the jobs named, once each, and
// the spool is empty.
func waitJobs(t *testing.T, e *env, g *gw, want []string) {
	t.Helper()
	_, js, _ := natstest.Connect(t, e.srv)
	natstest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		n, err := streamMsgs(js)
		if err != nil {
			return err
		}
		if d := g.queue(t).Spool.Depth; n != uint64(len(want)) || d != 0 {
			return fmt.Errorf("JOBS holds %d, spool %d; want %d and 0", n, d, len(want))
		}
		return nil
	})
	got := jobsInStream(t, js)
	for _, id := range want {
		if !got[id] {
			t.Errorf("job %s missing from JOBS", id)
		}
	}
	if len(got) != len(want) {
		t.Errorf("JOBS holds %d jobs, want %d", len(got), len(want))
	}
}

func TestSpoolWhileJetStreamIsDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := e.start()
	g.ready(t)
	e.srv.Shutdown()
	ids := spoolWebhooks(t, g, 1000, 50)
	if d := g.queue(t).Spool.Depth; d != 50 {
		t.Errorf("spool depth %d, want 50", d)
	}
	code, body := g.do(t, http.MethodGet, "/metrics", nil, nil)
	if code != http.StatusOK || !strings.Contains(string(body), "orch_gateway_spool_depth 50") {
		t.Errorf("metrics lack the spool depth 50:\n%s", grep(string(body), "spool"))
	}
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitJobs(t, e, g, ids)
}

func TestSpoolSurvivesGatewayRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := e.start()
	g.ready(t)
	e.srv.Shutdown()
	ids := spoolWebhooks(t, g, 2000, 25)
	g.stop(t)
	// The new gateway starts while JetStream is still down, reads the
	// spool, and takes more webhooks behind the spooled ones.
	g = e.start()
	if d := g.queue(t).Spool.Depth; d != 25 {
		t.Errorf("spool depth after restart %d, want 25", d)
	}
	ids = append(ids, spoolWebhooks(t, g, 3000, 25)...)
	// A repeated event while spooled names the same job and adds nothing
	// to JOBS.
	if again := g.postPR(t, 2000, "opened"); again.Jobs[0].ID != ids[0] {
		t.Errorf("repeated event named %s, want %s", again.Jobs[0].ID, ids[0])
	}
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitJobs(t, e, g, ids)
}

func TestDedupeAcrossJetStreamRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := e.start()
	g.ready(t)
	first := g.postPR(t, 7, "opened")
	if first.Spooled {
		t.Fatal("spooled while JetStream was up")
	}
	// A runner takes and acks the job: WorkQueue retention removes it,
	// so after a restart JetStream's duplicate window no longer knows it.
	_, js, _ := natstest.Connect(t, e.srv)
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(1, 3, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	g.ready(t)
	again := g.postPR(t, 7, "opened")
	if again.Jobs[0].ID != first.Jobs[0].ID {
		t.Errorf("repeated event named %s, want %s", again.Jobs[0].ID, first.Jobs[0].ID)
	}
	_, js2, _ := natstest.Connect(t, e.srv)
	if n, err := streamMsgs(js2); err != nil || n != 0 {
		t.Errorf("JOBS holds %d messages (%v) after the repeat, want 0: the job was queued twice", n, err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.maxBody = 64 << 10
	g := e.start()
	g.ready(t)
	good := prBody(t, 42, "opened")
	planeBody, planeH := readFixture(t, "plane/issue__updated_labels")
	malformed := []byte(`{"action": "opened", "pull_request": {`)
	big := append([]byte(`{"pad":"`), bytes.Repeat([]byte("x"), 100<<10)...)
	big = append(big, `"}`...)
	form := []byte("payload=" + string(good))
	var spoilt map[string]any
	if err := json.Unmarshal(good, &spoilt); err != nil {
		t.Fatal(err)
	}
	spoilt["pull_request"].(map[string]any)["number"] = "42"
	wrongType, err := json.Marshal(spoilt)
	if err != nil {
		t.Fatal(err)
	}
	with := func(h map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for a, b := range h {
			out[a] = b
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	tests := []struct {
		name    string
		path    string
		method  string
		headers map[string]string
		body    []byte
		code    int
	}{
		{"missing signature", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, ""), good, 401},
		{"empty signature", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, " "), good, 401},
		{"bad signature", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, "deadbeef"), good, 401},
		{"wrong secret", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, webhook.Sign("other", good)), good, 401},
		{"malformed JSON, valid signature", "/webhooks/gitea", "POST", giteaHeaders("pull_request", malformed), malformed, 400},
		{"a field orch reads has the wrong JSON type", "/webhooks/gitea", "POST", giteaHeaders("pull_request", wrongType), wrongType, 400},
		{"malformed JSON of an event orch does not act on", "/webhooks/gitea", "POST", giteaHeaders("wiki", malformed), malformed, 400},
		{"missing event type", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaEventType, ""), good, 400},
		{"oversized body", "/webhooks/gitea", "POST", giteaHeaders("pull_request", big), big, 413},
		{"unknown event type", "/webhooks/gitea", "POST", giteaHeaders("wiki", good), good, 200},
		{"form-encoded body", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", form), "Content-Type", "application/x-www-form-urlencoded"), form, 415},
		{"plane: wrong secret", "/webhooks/plane", "POST", with(planeH, webhook.PlaneSignature, webhook.Sign("other", planeBody)), planeBody, 401},
		{"plane: missing signature", "/webhooks/plane", "POST", with(planeH, webhook.PlaneSignature, ""), planeBody, 401},
		{"plane: malformed JSON, valid signature", "/webhooks/plane", "POST",
			with(planeH, webhook.PlaneSignature, webhook.Sign(planeSecret, malformed)), malformed, 400},
		{"plane: event header disagrees with body", "/webhooks/plane", "POST", with(planeH, webhook.PlaneEventHeader, "cycle"), planeBody, 400},
		{"wrong method", "/webhooks/gitea", "GET", nil, nil, 405},
		{"wrong method on the API", "/queue", "DELETE", nil, nil, 405},
	}
	// says holds part of the error answer of some cases: the person
	// setting up the webhook learns what is wrong.
	says := map[string]string{
		"a field orch reads has the wrong JSON type":      "pull_request.number is string, want number",
		"malformed JSON of an event orch does not act on": "not JSON",
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := g.do(t, tt.method, tt.path, tt.headers, tt.body)
			if code != tt.code {
				t.Errorf("answered %d %s, want %d", code, body, tt.code)
			}
			var ans map[string]any
			if err := json.Unmarshal(body, &ans); err != nil {
				t.Errorf("answer is not JSON: %q", body)
			}
			if code >= 400 && ans["error"] == nil {
				t.Errorf("error answer without \"error\": %s", body)
			}
			if msg, _ := ans["error"].(string); !strings.Contains(msg, says[tt.name]) {
				t.Errorf("error %q does not say %q", msg, says[tt.name])
			}
		})
	}
	_, js, kv := natstest.Connect(t, e.srv)
	if n, err := streamMsgs(js); err != nil || n != 0 {
		t.Errorf("JOBS holds %d messages (%v), want 0", n, err)
	}
	if keys, err := kv.ListKeys(context.Background()); err == nil {
		for k := range keys.Keys() {
			t.Errorf("status record %s written for bad input", k)
		}
	}
	if d := g.queue(t).Spool.Depth; d != 0 {
		t.Errorf("spool depth %d, want 0", d)
	}
}

// Every fixture, with the headers and signature its sender really sent, is
// accepted or ignored, never refused.
func TestFixturesOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := e.start()
	g.ready(t)
	files, err := filepath.Glob("testdata/*/*.headers.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in testdata (%v)", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "testdata/"), ".headers.json")
		t.Run(name, func(t *testing.T) {
			body, h := readFixture(t, name)
			path := "/webhooks/" + strings.Split(name, "/")[0]
			code, out := g.do(t, http.MethodPost, path, h, body)
			if code != http.StatusOK && code != http.StatusAccepted {
				t.Errorf("answered %d %s", code, out)
			}
		})
	}
}

func TestAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := e.start()
	g.ready(t)
	auth := map[string]string{"Authorization": "Bearer " + apiToken, "Content-Type": "application/json"}

	t.Run("write endpoints need the token", func(t *testing.T) {
		for _, path := range []string{"/jobs", "/jobs/abc/cancel", "/jobs/abc/retry"} {
			if code, body := g.do(t, http.MethodPost, path, nil, []byte(`{}`)); code != http.StatusUnauthorized {
				t.Errorf("POST %s without token: %d %s", path, code, body)
			}
			if code, _ := g.do(t, http.MethodPost, path, map[string]string{"Authorization": "Bearer nope"}, nil); code != http.StatusUnauthorized {
				t.Errorf("POST %s with a wrong token: %d", path, code)
			}
		}
	})

	var manual string
	t.Run("enqueue by hand", func(t *testing.T) {
		req := []byte(`{"project":"widgets","kind":"implement","task":{"id":"WID-9","title":"By hand"},"key":"k1"}`)
		code, body := g.do(t, http.MethodPost, "/jobs", auth, req)
		if code != http.StatusAccepted {
			t.Fatalf("POST /jobs: %d %s", code, body)
		}
		var a accepted
		_ = json.Unmarshal(body, &a)
		if len(a.Jobs) != 1 || a.Jobs[0].Task != "wid-9" || a.Jobs[0].Kind != "implement" {
			t.Fatalf("POST /jobs answer %s", body)
		}
		manual = a.Jobs[0].ID
		if _, again := g.do(t, http.MethodPost, "/jobs", auth, req); !strings.Contains(string(again), manual) {
			t.Errorf("the same key named another job: %s", again)
		}
		for _, bad := range []string{`{"project":"nope","kind":"fix","task":{"id":"x"}}`, `{"project":"widgets","kind":"dance","task":{"id":"x"}}`, `{"project":"widgets","kind":"fix","task":{}}`, `{`} {
			if code, body := g.do(t, http.MethodPost, "/jobs", auth, []byte(bad)); code != http.StatusBadRequest {
				t.Errorf("POST /jobs %s: %d %s", bad, code, body)
			}
		}
	})

	t.Run("get a job", func(t *testing.T) {
		code, body := g.read(t, "/jobs/"+manual)
		var ans struct {
			Job    proto.Job    `json:"job"`
			Status proto.Status `json:"status"`
		}
		if err := json.Unmarshal(body, &ans); err != nil || code != 200 || ans.Job.ID != manual || ans.Status.State != proto.StateQueued {
			t.Errorf("GET /jobs/%s: %d %s", manual, code, body)
		}
		if code, _ := g.read(t, "/jobs/nope"); code != http.StatusNotFound {
			t.Errorf("unknown job: %d", code)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		code, body := g.do(t, http.MethodPost, "/jobs/"+manual+"/cancel", auth, nil)
		if code != http.StatusOK || !strings.Contains(string(body), `"cancelled"`) {
			t.Errorf("cancel: %d %s", code, body)
		}
		if code, body := g.do(t, http.MethodPost, "/jobs/"+manual+"/cancel", auth, nil); code != http.StatusConflict {
			t.Errorf("second cancel: %d %s", code, body)
		}
		if code, _ := g.do(t, http.MethodPost, "/jobs/nope/cancel", auth, nil); code != http.StatusNotFound {
			t.Errorf("cancel unknown: %d", code)
		}
	})

	t.Run("retry a dead letter", func(t *testing.T) {
		if code, body := g.do(t, http.MethodPost, "/jobs/"+manual+"/retry", auth, nil); code != http.StatusConflict {
			t.Errorf("retry of a job not dead-lettered: %d %s", code, body)
		}
		// Dead-letter a job as the notifier does.
		_, js, kv := natstest.Connect(t, e.srv)
		ctx := context.Background()
		dead := proto.Job{Schema: 1, ID: proto.JobID("dead"), Kind: proto.KindFix, Project: "widgets", Task: proto.Task{ID: "wid-3"}}
		data, _ := json.Marshal(dead)
		ack, err := js.Publish(ctx, proto.DLQSubject("widgets", proto.KindFix), data)
		if err != nil {
			t.Fatal(err)
		}
		statustest.Set(t, status.New(kv), &dead, func(s *proto.Status) {
			s.State, s.DLQSeq = proto.StateFailed, ack.Sequence
		})
		code, body := g.do(t, http.MethodPost, "/jobs/"+dead.ID+"/retry", auth, nil)
		var a accepted
		_ = json.Unmarshal(body, &a)
		if code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].ID == dead.ID {
			t.Fatalf("retry: %d %s", code, body)
		}
		var ans struct {
			Job proto.Job `json:"job"`
		}
		_, body = g.read(t, "/jobs/"+a.Jobs[0].ID)
		if err := json.Unmarshal(body, &ans); err != nil || ans.Job.RetryOf != dead.ID || ans.Job.Task.ID != "wid-3" {
			t.Errorf("retried job: %s", body)
		}
		if _, again := g.do(t, http.MethodPost, "/jobs/"+dead.ID+"/retry", auth, nil); !strings.Contains(string(again), a.Jobs[0].ID) {
			t.Errorf("second retry of the same dead letter named another job: %s", again)
		}
	})

	t.Run("closing a pull request cancels its task and queues a cleanup", func(t *testing.T) {
		opened := g.postPR(t, 77, "opened")
		review := opened.Jobs[0].ID
		natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
			for _, r := range g.queue(t).Recent {
				if r.ID == review {
					return nil
				}
			}
			return fmt.Errorf("job %s not in the index yet", review)
		})
		closed := g.postPR(t, 77, "closed")
		if closed.Cancel == nil || closed.Cancel.Task != "pr-77" || len(closed.Jobs) != 1 || closed.Jobs[0].Kind != "cleanup" {
			t.Fatalf("close answer %+v", closed)
		}
		var ans struct {
			Status proto.Status `json:"status"`
		}
		_, body := g.read(t, "/jobs/"+review)
		if err := json.Unmarshal(body, &ans); err != nil || ans.Status.State != proto.StateCancelled {
			t.Errorf("review job after close: %s", body)
		}
	})

	t.Run("queue figures", func(t *testing.T) {
		q := g.queue(t)
		if q.Stream == nil || q.Consumer != nil && q.Consumer.Pending > q.Stream.Messages {
			t.Errorf("stream figures %+v", q)
		}
		for _, s := range proto.States {
			if _, ok := q.Counts[string(s)]; !ok {
				t.Errorf("counts lack %s: %v", s, q.Counts)
			}
		}
		if len(q.Recent) == 0 || q.Recent[0].UpdatedAt.IsZero() {
			t.Errorf("recent %+v", q.Recent)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		_, body := g.do(t, http.MethodGet, "/metrics", nil, nil)
		for _, want := range []string{
			`orch_gateway_webhooks_total{event="pull_request",outcome="queued",source="gitea"}`,
			`orch_gateway_publish_seconds_count`,
			`orch_gateway_spool_depth 0`,
			`orch_jobs{state="cancelled"}`,
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("request id", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, g.url+"/healthz", nil)
		req.Header.Set("X-Request-Id", "abc-123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Request-Id"); got != "abc-123" {
			t.Errorf("request id %q, want abc-123", got)
		}
		resp, err = http.Get(g.url + "/nowhere")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 || len(resp.Header.Get("X-Request-Id")) < 16 {
			t.Errorf("404 answer: %d, request id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
		}
	})
}

// SIGHUP reloads the registry; a bad file keeps the old one.
func TestReloadOnSIGHUP(t *testing.T) {
	e := newEnv(t)
	e.writeRegistry("projects:\n  - key: other\n    gitea_repo: acme/other\n")
	g := e.start()
	g.ready(t)
	body, h := readFixture(t, "plane/issue__updated_labels")
	post := func() (int, string) {
		code, out := g.do(t, http.MethodPost, "/webhooks/plane", h, body)
		return code, string(out)
	}
	if code, out := post(); code != http.StatusOK || !strings.Contains(out, "unknown plane project") {
		t.Fatalf("before reload: %d %s", code, out)
	}
	e.writeRegistry(registryYAML)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if code, out := post(); code != http.StatusAccepted {
			return fmt.Errorf("after reload: %d %s", code, out)
		}
		return nil
	})
	e.writeRegistry("projects:\n  - key: Bad Key\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		_, m := g.do(t, http.MethodGet, "/metrics", nil, nil)
		if !strings.Contains(string(m), `orch_gateway_registry_reloads_total{result="error"} 1`) {
			return fmt.Errorf("bad reload not counted:\n%s", grep(string(m), "reloads"))
		}
		return nil
	})
	if code, out := post(); code != http.StatusAccepted {
		t.Errorf("after a bad reload the old registry is gone: %d %s", code, out)
	}
}

func grep(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
