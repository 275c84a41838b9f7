package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// The secrets the fixtures were signed with, the Plane project they
// name, and the token of the API.
const (
	giteaSecret  = "fixture-secret"
	planeSecret  = "plane_wh_5f1c0d6b8e2a4c7f9b3d1e0a6c8b2f47"
	planeProject = "22b6fc9c-1849-45da-b103-52a3e3a6b4c1"
	apiToken     = "t0ken-of-the-gateway-tests-0123456789"
)

// registryYAML serves the project of the fixtures, for Gitea and Plane.
var registryYAML = testkit.RegistryYAML(
	"plane_project: "+planeProject,
	`mention: "@agent-bot"`,
	"agent_user: agent-bot",
	"trusted_actors: [alice, bob, alice@example.com]",
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// gw is one running gateway.
type gw struct {
	url    string
	cancel context.CancelFunc
	done   chan error
}

// env is what a gateway runs against: a JetStream server, a data
// directory and a registry, and the settings a test may change before
// start.
type env struct {
	t        *testing.T
	srv      *embedded.Server
	dataDir  string
	projects string
	token    string
	maxBody  service.ByteSize
	// clock is the gateway's clock of logins and throttling.
	clock *clock
	// tune, when set, changes the gateway's configuration last.
	tune func(*gateway.Config)
}

// clock is a gateway's clock, which a test moves forward.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// advance moves the clock forward by d.
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, srv: natstest.Server(t), dataDir: dir, projects: filepath.Join(dir, "projects.yaml"), token: apiToken, clock: &clock{}}
	e.writeRegistry(registryYAML)
	return e
}

// newGateway runs a gateway on an env of its own, as tune (when not nil)
// leaves the env, and waits until it is ready.
func newGateway(t *testing.T, tune func(*env)) (*env, *gw) {
	t.Helper()
	e := newEnv(t)
	if tune != nil {
		tune(e)
	}
	g := e.start()
	g.ready(t)
	return e, g
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
	ln := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	g := &gw{url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	cfg := gateway.Config{
		Common:   service.Common{NATSURL: e.srv.URL(), DataDir: e.dataDir},
		Listener: ln, ProjectsFile: e.projects, GiteaSecret: giteaSecret, PlaneSecret: planeSecret,
		APIToken: e.token, MaxBodyBytes: e.maxBody, Now: e.clock.now,
	}
	if e.tune != nil {
		e.tune(&cfg)
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

// metrics GETs /metrics, which needs no token, and fails the test unless
// it answers 200.
func (g *gw) metrics(t *testing.T) string {
	t.Helper()
	code, body := g.do(t, http.MethodGet, "/metrics", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	return string(body)
}

// readFixture reads a recorded payload of testdata and its headers.
func readFixture(t *testing.T, name string) ([]byte, map[string]string) {
	t.Helper()
	return testkit.Fixture(t, "testdata", name)
}

// prBody is the pull request fixture as pull request number n and action.
func prBody(t *testing.T, n int, action string) []byte {
	t.Helper()
	raw, _ := readFixture(t, "gitea/pull_request__opened")
	return testkit.EditJSON(t, raw, func(m map[string]any) {
		m["number"], m["action"] = n, action
		pr := m["pull_request"].(map[string]any)
		pr["number"] = n
		if action == "closed" {
			pr["state"], pr["closed_at"] = "closed", "2025-06-02T12:00:00Z"
		}
	})
}

// giteaHeaders are the headers of a delivery of event with body, signed
// with giteaSecret, as Gitea sends them.
func giteaHeaders(event string, body []byte) map[string]string {
	h := testkit.GiteaHeaders(giteaSecret, event, body)
	h[webhook.GiteaDelivery] = fmt.Sprint(time.Now().UnixNano())
	return h
}

// accepted is a 202 webhook answer.
type accepted struct {
	Jobs []struct {
		ID, Kind, Project, Task string
		Duplicate               bool `json:"duplicate"`
	} `json:"jobs"`
	Cancel *struct {
		Project, Task string
	} `json:"cancel"`
	Spooled bool `json:"spooled"`
}

// postGitea sends body as a signed pull_request delivery, fails the test
// unless it is answered 202, and returns the answer, decoded and as sent.
func (g *gw) postGitea(t *testing.T, body []byte) (accepted, []byte) {
	t.Helper()
	code, out := g.do(t, http.MethodPost, "/webhooks/gitea", giteaHeaders("pull_request", body), body)
	if code != http.StatusAccepted {
		t.Fatalf("webhook answered %d %s, want 202", code, out)
	}
	var a accepted
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatal(err)
	}
	return a, out
}

// postPR sends the pull request fixture as pull request n and action.
func (g *gw) postPR(t *testing.T, n int, action string) accepted {
	t.Helper()
	a, _ := g.postGitea(t, prBody(t, n, action))
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

// jobAnswer is the body of GET /jobs/{id}.
type jobAnswer struct {
	Job    proto.Job    `json:"job"`
	Status proto.Status `json:"status"`
}

// job GETs /jobs/{id}.
func (g *gw) job(t *testing.T, id string) (int, jobAnswer) {
	t.Helper()
	code, body := g.read(t, "/jobs/"+id)
	var a jobAnswer
	if code == http.StatusOK {
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatal(err)
		}
	}
	return code, a
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

func grep(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
