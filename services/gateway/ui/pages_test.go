package ui_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

func TestEveryPageSendsALoggedOutBrowserToTheLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	e.put(proto.Status{Job: job("j1", "pr-42", "Sorting"), State: proto.StateRunning, Attempt: 1})
	c := e.client()
	for _, path := range []string{"/ui/", "/ui/?state=failed", "/ui/jobs/j1", "/ui/jobs/j1/log", "/ui/jobs/j1/cancel", "/ui/dead-letters"} {
		a := c.get(path)
		want := "/ui/login?next=" + url.QueryEscape(path)
		if a.code != http.StatusSeeOther || a.header.Get("Location") != want {
			t.Errorf("GET %s: %d to %q, want 303 to %q", path, a.code, a.header.Get("Location"), want)
		}
	}
	// An action without a session is refused, and changes nothing.
	if a := c.post("/ui/jobs/j1/cancel", url.Values{"csrf": {"x"}}); a.code != http.StatusUnauthorized {
		t.Errorf("cancel without a session: %d, want 401", a.code)
	}
	if s := e.state("j1"); s != proto.StateRunning {
		t.Errorf("job is %s after a refused cancel", s)
	}
	// A link followed from another site arrives without the SameSite=Strict
	// cookie: the page reloads itself from here instead of asking to log in.
	req, _ := http.NewRequest(http.MethodGet, e.url+"/ui/jobs/j1", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if a := c.do(req); a.code != http.StatusOK || !strings.Contains(a.body, `http-equiv="refresh" content="0; url=/ui/jobs/j1"`) {
		t.Errorf("cross-site link: %d %s", a.code, a.body)
	}
}

func TestDashboardIsOffWithoutAToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	for _, path := range []string{"/ui/", "/ui/login", "/ui/jobs/x"} {
		if a := e.client().get(path); a.code != http.StatusForbidden || !strings.Contains(a.body, "ORCH_API_TOKEN") {
			t.Errorf("GET %s: %d %s", path, a.code, a.body)
		}
	}
}

func TestQueuePageShowsCountsFiltersAndPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	for i := range 55 {
		j := job(fmt.Sprintf("q%02d", i), fmt.Sprintf("pr-%d", i), "")
		st := proto.Status{Job: j, State: proto.StateDone, Attempt: 1, Runner: "build-01", CostUSD: 0.25}
		if i%5 == 0 {
			st.State = proto.StateFailed
			j.Project = "gadgets"
			st.Job = j
		}
		e.put(st)
	}
	c := e.loggedIn()
	a := c.waitPage("/ui/", "(55, latest change first)")
	for _, want := range []string{`<span class="n">44</span> <span class="label">done</span>`,
		`<span class="n">11</span> <span class="label">failed</span>`, "Page 1 of 2", "build-01", "$0.25", "Stream JOBS"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("queue page lacks %q", want)
		}
	}
	if n := strings.Count(a.body, "<tr data-job="); n != 50 {
		t.Errorf("page 1 lists %d jobs, want 50", n)
	}
	// Newest first: q54 changed last.
	if i, j := strings.Index(a.body, `data-job="q54"`), strings.Index(a.body, `data-job="q53"`); i < 0 || i > j {
		t.Errorf("q54 is not listed before q53")
	}
	if a := c.get("/ui/?page=2"); strings.Count(a.body, "<tr data-job=") != 5 {
		t.Errorf("page 2 lists %d jobs, want 5", strings.Count(a.body, "<tr data-job="))
	}
	a = c.get("/ui/?state=failed&project=gadgets&kind=review")
	if n := strings.Count(a.body, "<tr data-job="); n != 11 || strings.Contains(a.body, `state-done">done</span></td>`) {
		t.Errorf("filter failed/gadgets/review lists %d jobs, want the 11 failed", n)
	}
	if a := c.get("/ui/?state=failed&project=widgets"); !strings.Contains(a.body, "No jobs match this filter") {
		t.Error("an empty filter result says nothing")
	}
}

const evil = `<script>alert("x")</script><img src=x onerror=alert(1)>`

func TestJobPageShowsTheJobItsStatusAndItsLogSafely(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	j := job("j1", "pr-42", "Sort "+evil)
	j.Task.Body = "Body " + evil
	j.Trigger = "@agent please " + evil
	code := 3
	e.writeLog("j1", 1, "first attempt\n")
	logPath := e.writeLog("j1", 2, "running go test\nFAIL "+evil+"\n")
	e.put(proto.Status{Job: j, State: proto.StateRetrying, Attempt: 2, Runner: "build-01", ExitCode: &code,
		Error: "agent exited with code 3 " + evil, Log: logPath, CostUSD: 0.37, SpentUSD: 0.5, Turns: 12,
		StartedAt: time.Now().Add(-time.Minute), FinishedAt: time.Now()})
	c := e.loggedIn()
	a := c.get("/ui/jobs/j1")
	if a.code != http.StatusOK {
		t.Fatalf("job page: %d %s", a.code, a.body)
	}
	for _, want := range []string{
		"Sort &lt;script&gt;", `href="https://git.example.com/acme/widgets/pulls/42"`, "Open the task in Gitea",
		"2 of 3", "build-01", "<dd>3</dd>", "$0.37 (12 turns); all attempts $0.50", "agent exited with code 3",
		"pull_request", "by alice", "@agent please &lt;script&gt;", "Body &lt;script&gt;",
		"Attempt 2", "Attempt 1", "first attempt", "running go test", "FAIL &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img",
		`href="/ui/jobs/j1/cancel"`,
	} {
		if !strings.Contains(a.body, want) {
			t.Errorf("job page lacks %q", want)
		}
	}
	if strings.Contains(a.body, "<script>alert") || strings.Contains(a.body, "<img src=x") {
		t.Error("job page renders HTML from the job or its log")
	}
	if !strings.Contains(a.header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Errorf("no CSP: %q", a.header.Get("Content-Security-Policy"))
	}
	// A task URL that is not http(s) is no link.
	j.Task.URL = "javascript:alert(1)"
	e.put(proto.Status{Job: j, State: proto.StateQueued})
	if a := c.get("/ui/jobs/j1"); strings.Contains(a.body, "javascript:") || strings.Contains(a.body, "Open the task") {
		t.Error("a javascript: task URL is linked")
	}
	if a := c.get("/ui/jobs/nope"); a.code != http.StatusNotFound {
		t.Errorf("unknown job: %d", a.code)
	}
}

func TestJobPageWithoutALogSaysSo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	e.put(proto.Status{Job: job("j1", "pr-1", "t"), State: proto.StateDone, Attempt: 1, Log: "/elsewhere/j1/1.log"})
	if a := e.loggedIn().get("/ui/jobs/j1"); !strings.Contains(a.body, "log not available") || strings.Contains(a.body, `href="/ui/jobs/j1/cancel"`) {
		t.Errorf("job page: %s", a.body)
	}
}

func TestLogIsPlainTextAndFollowsTheRunningAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	j := job("j1", "pr-1", "t")
	p := e.writeLog("j1", 1, "line one <b>\n")
	e.put(proto.Status{Job: j, State: proto.StateRunning, Attempt: 1, Log: p})
	c := e.loggedIn()
	a := c.get("/ui/jobs/j1/log?attempt=1")
	if a.code != http.StatusOK || a.body != "line one <b>\n" || a.header.Get("Content-Type") != "text/plain; charset=utf-8" ||
		a.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("log: %d %q %v", a.code, a.body, a.header)
	}
	if a := c.get("/ui/jobs/j1/log?attempt=2"); a.code != http.StatusNotFound {
		t.Errorf("attempt 2 of a job at attempt 1: %d", a.code)
	}

	req, _ := http.NewRequest(http.MethodGet, e.url+"/ui/jobs/j1/log?attempt=1&follow=1", nil)
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 10)
	go func() { // ends when the stream does
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(20 * time.Second):
			t.Fatal("no line from the followed log")
		}
		return ""
	}
	if l := next(); l != "line one <b>" {
		t.Fatalf("first line %q", l)
	}
	e.writeLog("j1", 1, "line two\n")
	if l := next(); l != "line two" {
		t.Fatalf("second line %q", l)
	}
	// The attempt ends: the stream ends.
	e.put(proto.Status{Job: j, State: proto.StateDone, Attempt: 1, Log: p})
	select {
	case l, ok := <-lines:
		if ok {
			t.Errorf("unexpected line %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Error("the followed log did not end with its attempt")
	}
}

func TestCancelNeedsConfirmationAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	e.put(proto.Status{Job: job("j1", "pr-1", "Cancel me"), State: proto.StateRunning, Attempt: 1})
	c := e.loggedIn()
	confirm := c.get("/ui/jobs/j1/cancel")
	if confirm.code != http.StatusOK || !strings.Contains(confirm.body, "Cancel this job?") || !strings.Contains(confirm.body, "Yes, cancel it") {
		t.Fatalf("confirmation: %d %s", confirm.code, confirm.body)
	}
	token := c.csrf("/ui/jobs/j1/cancel")
	for name, form := range map[string]url.Values{"no token": {}, "wrong token": {"csrf": {"forged"}}} {
		if a := c.post("/ui/jobs/j1/cancel", form); a.code != http.StatusForbidden || !strings.Contains(a.body, "CSRF") {
			t.Errorf("%s: %d", name, a.code)
		}
	}
	// The right token from another site's page is still refused.
	req, _ := http.NewRequest(http.MethodPost, e.url+"/ui/jobs/j1/cancel", strings.NewReader(url.Values{"csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if a := c.do(req); a.code != http.StatusForbidden {
		t.Errorf("cross-origin post: %d", a.code)
	}
	// Another session's token does not fit this session.
	other := e.loggedIn().csrf("/ui/")
	if a := c.post("/ui/jobs/j1/cancel", url.Values{"csrf": {other}}); a.code != http.StatusForbidden {
		t.Errorf("another session's token: %d", a.code)
	}
	if s := e.state("j1"); s != proto.StateRunning {
		t.Fatalf("refused cancels changed the job to %s", s)
	}

	a := c.post("/ui/jobs/j1/cancel", url.Values{"csrf": {token}})
	if a.code != http.StatusSeeOther || a.header.Get("Location") != "/ui/jobs/j1" {
		t.Fatalf("cancel: %d to %q %s", a.code, a.header.Get("Location"), a.body)
	}
	if s := e.state("j1"); s != proto.StateCancelled {
		t.Errorf("job is %s after cancel", s)
	}
	// A second cancel is answered as the API answers it.
	if a := c.post("/ui/jobs/j1/cancel", url.Values{"csrf": {token}}); a.code != http.StatusConflict || !strings.Contains(a.body, "already ended") {
		t.Errorf("second cancel: %d %s", a.code, a.body)
	}
}

func TestRetryOfADeadLetterQueuesANewJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	j := job("j1", "pr-1", "Failed "+evil)
	e.deadLetter(j, "failed on every attempt "+evil)
	c := e.loggedIn()

	a := c.waitPage("/ui/dead-letters", "failed on every attempt")
	for _, want := range []string{"Failed &lt;script&gt;", `href="/ui/jobs/j1/retry"`, "<td data-label=\"Attempts\">3</td>"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("dead letters page lacks %q", want)
		}
	}
	if strings.Contains(a.body, "<script>alert") {
		t.Error("dead letters page renders HTML from a reason or title")
	}
	if a := c.get("/ui/jobs/j1"); !strings.Contains(a.body, `href="/ui/jobs/j1/retry"`) || strings.Contains(a.body, "/cancel") {
		t.Error("a dead-lettered job offers no retry, or a cancel")
	}
	if a := c.post("/ui/jobs/j1/retry", url.Values{}); a.code != http.StatusForbidden {
		t.Errorf("retry without CSRF token: %d", a.code)
	}
	a = c.post("/ui/jobs/j1/retry", url.Values{"csrf": {c.csrf("/ui/jobs/j1/retry")}})
	loc := a.header.Get("Location")
	if a.code != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/jobs/") || loc == "/ui/jobs/j1" {
		t.Fatalf("retry: %d to %q %s", a.code, loc, a.body)
	}
	newID := strings.TrimPrefix(loc, "/ui/jobs/")
	// The new job waits in JOBS; the API shows it queued.
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		req, err := http.NewRequest(http.MethodGet, e.url+"/jobs/"+newID, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+apiToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		var a struct {
			Job    proto.Job    `json:"job"`
			Status proto.Status `json:"status"`
		}
		if err := json.NewDecoder(res.Body).Decode(&a); err != nil || a.Job.RetryOf != "j1" || a.Status.State != proto.StateQueued {
			return fmt.Errorf("new job: %d %+v %v", res.StatusCode, a, err)
		}
		return nil
	})
	if a := c.waitPage(loc, "Retry of"); !strings.Contains(a.body, `href="/ui/jobs/j1"`) {
		t.Error("the new job does not link to the one it retries")
	}
	// A job that is not dead-lettered cannot be retried.
	e.put(proto.Status{Job: job("j2", "pr-2", "t"), State: proto.StateDone, Attempt: 1})
	if a := c.post("/ui/jobs/j2/retry", url.Values{"csrf": {c.csrf("/ui/")}}); a.code != http.StatusConflict {
		t.Errorf("retry of a done job: %d", a.code)
	}
}

func TestStaticFilesAreServedWithoutASession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apiToken)
	for _, path := range []string{"/ui/static/app.css", "/ui/static/app.js"} {
		if a := e.client().get(path); a.code != http.StatusOK || len(a.body) < 100 {
			t.Errorf("GET %s: %d", path, a.code)
		}
	}
}
