package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/ui"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

const apiToken = "s3cret-t0ken-of-the-dashboard-tests"

// clock is the gateway's clock, which a test moves forward.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// advance moves the clock forward by d.
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// env is one gateway, with the dashboard, on its own JetStream server. The
// tests play the runner and the notifier by writing status records and
// dead letters themselves.
type env struct {
	t     *testing.T
	url   string
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	logs  string // the runner's log directory
	clock *clock
}

func newEnv(t *testing.T, token string) *env {
	t.Helper()
	return newEnvWith(t, func(c *gateway.Config) { c.APIToken = token })
}

// newEnvWith is newEnv with the gateway's configuration as tune leaves it.
func newEnvWith(t *testing.T, tune func(*gateway.Config)) *env {
	t.Helper()
	dir := t.TempDir()
	srv := natstest.Server(t)
	projects := filepath.Join(dir, "projects.yaml")
	reg := "projects:\n  - key: widgets\n    gitea_repo: acme/widgets\n  - key: gadgets\n    gitea_repo: acme/gadgets\n"
	if err := os.WriteFile(projects, []byte(reg), 0o644); err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	cfg := gateway.Config{
		Common:   service.Common{NATSURL: srv.URL(), DataDir: dir},
		Listener: ln, ProjectsFile: projects, GiteaSecret: "g", PlaneSecret: "p", APIToken: apiToken,
	}
	clk := &clock{}
	cfg.Now = clk.now
	tune(&cfg)
	log := zaptest.NewLogger(t)
	testkit.Services(t, map[string]func(context.Context) error{
		"gateway.Run": func(ctx context.Context) error { return gateway.Run(ctx, cfg, log) },
	})
	_, js, kv := natstest.Connect(t, srv)
	e := &env{t: t, url: "http://" + ln.Addr().String(), js: js, kv: kv, logs: filepath.Join(dir, "logs"), clock: clk}
	testkit.Ready(t, nil, e.url, 30*time.Second)
	return e
}

// job returns a job of project widgets with a task named task.
func job(id, task, title string) proto.Job {
	return proto.Job{
		Schema: proto.SchemaVersion, ID: id, Kind: proto.KindReview, Project: "widgets",
		Task:      proto.Task{ID: task, Title: title, URL: "https://git.example.com/acme/widgets/pulls/42", PR: 42},
		Source:    proto.Source{System: "gitea", Event: "pull_request", Delivery: "d-1", Actor: "alice"},
		CreatedAt: time.Now().UTC().Add(-3 * time.Minute),
	}
}

// put writes a status record as a runner would.
func (e *env) put(st proto.Status) {
	e.t.Helper()
	st.Schema, st.UpdatedAt = proto.SchemaVersion, time.Now().UTC()
	if st.MaxAttempts == 0 {
		st.MaxAttempts = 3
	}
	data, err := json.Marshal(st)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.kv.Put(context.Background(), st.Job.ID, data); err != nil {
		e.t.Fatal(err)
	}
}

// state reads a job's state from the status bucket.
func (e *env) state(id string) proto.State {
	e.t.Helper()
	ent, err := e.kv.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("reading %s: %v", id, err)
	}
	st, err := proto.DecodeStatus(ent.Value())
	if err != nil {
		e.t.Fatal(err)
	}
	return st.State
}

// writeLog publishes output of attempt n to JOBS_LOGS as a runner does,
// and returns the path a runner would name in the record.
func (e *env) writeLog(id string, n int, text string) string {
	e.t.Helper()
	msg := nats.NewMsg(proto.LogSubject(id, n))
	msg.Header.Set(joblog.HeaderKind, joblog.KindBoth)
	msg.Data = []byte(text)
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		e.t.Fatal(err)
	}
	return filepath.Join(e.logs, id, fmt.Sprintf("%d.log", n))
}

// deadLetter puts the job in JOBS_DLQ as the notifier does and records
// it failed, and returns its sequence.
func (e *env) deadLetter(j proto.Job, reason string) uint64 {
	e.t.Helper()
	data, _ := json.Marshal(j)
	m := nats.NewMsg(proto.DLQSubject(j.Project, j.Kind))
	m.Data = data
	m.Header.Set(proto.HeaderDLQReason, reason)
	m.Header.Set(proto.HeaderDLQAttempts, "3")
	m.Header.Set(proto.HeaderDLQTime, time.Now().UTC().Format(time.RFC3339))
	ack, err := e.js.PublishMsg(context.Background(), m)
	if err != nil {
		e.t.Fatal(err)
	}
	code := 1
	e.put(proto.Status{Job: j, State: proto.StateFailed, Attempt: 3, ExitCode: &code, Error: "agent exited with code 1", DLQSeq: ack.Sequence})
	return ack.Sequence
}

// client is a browser without JavaScript: it keeps cookies and does not
// follow redirects, so tests see them.
type client struct {
	t    *testing.T
	e    *env
	http *http.Client
}

func (e *env) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: e.t, e: e, http: &http.Client{
		Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// loggedIn is a client that has used a login link.
func (e *env) loggedIn() *client {
	c := e.client()
	resp := c.get(e.loginLink(""))
	if resp.code != http.StatusSeeOther {
		e.t.Fatalf("login: %d %s", resp.code, resp.body)
	}
	return c
}

// loginLink makes a login link with the API token, as an operator does
// (POST /ui/login-links, with ?next= when next is set), waiting while the
// gateway has not reached its bucket yet, and returns it.
func (e *env) loginLink(next string) string {
	e.t.Helper()
	path := "/ui/login-links"
	if next != "" {
		path += "?next=" + url.QueryEscape(next)
	}
	var link ui.LoginLink
	natstest.CheckFor(e.t, 20*time.Second, 20*time.Millisecond, func() error {
		code, body := e.makeLink(path, apiToken)
		if code != http.StatusOK {
			return fmt.Errorf("POST %s: %d %s", path, code, body)
		}
		return json.Unmarshal([]byte(body), &link)
	})
	return link.Link
}

// makeLink POSTs to path (/ui/login-links...) with token as the bearer.
func (e *env) makeLink(path, token string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.url+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	a := e.client().do(req)
	return a.code, a.body
}

type answer struct {
	code   int
	header http.Header
	body   string
}

func (c *client) do(req *http.Request) answer {
	c.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (c *client) get(path string) answer {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.e.url+path, nil)
	return c.do(req)
}

// post sends a form as a browser on this page would (Origin included).
func (c *client) post(path string, form url.Values) answer {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.e.url+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", c.e.url)
	return c.do(req)
}

var csrfPattern = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page's form.
func (c *client) csrf(path string) string {
	c.t.Helper()
	a := c.get(path)
	m := csrfPattern.FindStringSubmatch(a.body)
	if m == nil {
		c.t.Fatalf("no CSRF token on %s (%d): %s", path, a.code, a.body)
	}
	return m[1]
}

// waitPage polls a page until it contains want.
func (c *client) waitPage(path, want string) answer {
	c.t.Helper()
	var a answer
	natstest.CheckFor(c.t, 20*time.Second, 50*time.Millisecond, func() error {
		a = c.get(path)
		if a.code != http.StatusOK || !strings.Contains(a.body, want) {
			return fmt.Errorf("GET %s: %d, want %q in:\n%s", path, a.code, want, a.body)
		}
		return nil
	})
	return a
}
