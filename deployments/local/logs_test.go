package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/logstream"
)

const logsToken = "logs-test-token-of-the-local-system"

// logSystem is JetStream, two runners and a gateway and a notifier, each
// with its own data directory: no service can read another's disk, so
// every log the gateway serves and the notifier quotes came through the
// stream. The agent is a script whose behaviour each job's task title
// picks.
type logSystem struct {
	url      string
	dir      string
	telegram *testkit.Telegram
}

// agentScript, by task: "print" prints $DIR/output.txt and fails the
// first attempt; "follow" prints a line, waits for $DIR/release, prints
// another; "doomed" prints lines and fails every attempt.
const agentScript = `DIR=%q
case "$ORCH_TASK" in
print) echo "attempt $ORCH_ATTEMPT"; cat "$DIR/output.txt"; [ "$ORCH_ATTEMPT" = 1 ] && exit 1; exit 0;;
follow) echo "first line"; while [ ! -e "$DIR/release" ]; do sleep 0.05; done; echo "second line"; exit 0;;
doomed) i=0; while [ $i -lt 200 ]; do echo "working $i"; i=$((i+1)); done; echo "FINAL: assertion failed in attempt $ORCH_ATTEMPT"; exit 2;;
esac
exit 9
`

func startLogSystem(t *testing.T) *logSystem {
	dir := t.TempDir()
	srv, login := authServer(t)
	sys := &logSystem{dir: dir, telegram: testkit.NewTelegram(t, "123:abc")}
	agent := testkit.AgentScript(t, dir, "agent.sh", fmt.Sprintf(agentScript, dir))
	projects, _ := testkit.Project(t, dir, "")
	ln := testkit.Listen(t)
	sys.url = "http://" + ln.Addr().String()
	common := func(name string) service.Common {
		// Both runners log in as the runner's NATS user.
		user, _, _ := strings.Cut(name, "-")
		return login(user, service.Common{NATSURL: srv.URL(), DataDir: filepath.Join(dir, name)})
	}
	log := zaptest.NewLogger(t)
	runnerCfg := func(name string) runner.Config {
		return runner.Config{Common: common(name), ProjectsFile: projects, MaxConcurrency: 2, MaxAttempts: 2,
			RetryDelay: 50 * time.Millisecond, AgentCommand: agent, AckWait: 3 * time.Second,
			KillGrace: 500 * time.Millisecond, ShutdownGrace: time.Second, Name: name,
			// No file is left on the runners' disks: the stream is all.
			LogLocal: new(false),
			// A confined agent (auto picks bubblewrap) reads the files
			// the test writes for it.
			AgentSandboxRO: []string{dir}}
	}
	testkit.Services(t, map[string]func(context.Context) error{
		"gateway": func(ctx context.Context) error {
			return gateway.Run(ctx, gateway.Config{Common: common("gateway"), ProjectsFile: projects, GiteaSecret: "g",
				PlaneSecret: "p", APIToken: logsToken, Listener: ln}, log.Named("gateway"))
		},
		"runner-a": func(ctx context.Context) error { return runner.Run(ctx, runnerCfg("runner-a"), log.Named("runner-a")) },
		"runner-b": func(ctx context.Context) error { return runner.Run(ctx, runnerCfg("runner-b"), log.Named("runner-b")) },
		"notifier": func(ctx context.Context) error {
			return notifier.Run(ctx, notifier.Config{Common: common("notifier"), TelegramBotToken: "123:abc", TelegramChatID: "42",
				TelegramAPIURL: sys.telegram.URL, RetryDelay: 100 * time.Millisecond, PublicURL: "https://orch.example.com"}, log.Named("notifier"))
		},
	})
	testkit.Ready(t, nil, sys.url, 20*time.Second)
	return sys
}

// request sends a request with the API token.
func (s *logSystem) request(t *testing.T, method, path string, body io.Reader) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, s.url+path, body)
	req.Header.Set("Authorization", "Bearer "+logsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// enqueue queues a job for task, retrying while the gateway is still
// setting up its streams.
func (s *logSystem) enqueue(t *testing.T, task string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"project": "widgets", "kind": "implement", "key": task,
		"task": map[string]string{"id": task, "title": task}})
	var id string
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		resp := s.request(t, http.MethodPost, "/jobs", bytes.NewReader(body))
		defer resp.Body.Close()
		var ans struct {
			Jobs []struct {
				ID string `json:"id"`
			} `json:"jobs"`
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 || json.Unmarshal(raw, &ans) != nil || len(ans.Jobs) != 1 {
			return fmt.Errorf("POST /jobs: %d %s", resp.StatusCode, raw)
		}
		id = ans.Jobs[0].ID
		return nil
	})
	return id
}

func (s *logSystem) get(t *testing.T, path string) (int, []byte) {
	t.Helper()
	resp := s.request(t, http.MethodGet, path, nil)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (s *logSystem) waitState(t *testing.T, id string, want proto.State) *proto.Status {
	t.Helper()
	var st proto.Status
	natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		code, body := s.get(t, "/jobs/"+id)
		var ans struct {
			Status proto.Status `json:"status"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &ans) != nil {
			return fmt.Errorf("GET /jobs/%s: %d %s", id, code, body)
		}
		if st = ans.Status; st.State != want {
			return fmt.Errorf("job %s is %s, want %s", id, st.State, want)
		}
		return nil
	})
	return &st
}

// bigOutput is 10,000 lines: some longer than 64 KiB, some with bytes
// that are not UTF-8. It returns the raw bytes and their readable form.
func bigOutput() (raw, readable []byte) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 10000 {
		var line []byte
		switch {
		case i%1000 == 7:
			line = bytes.Repeat([]byte(fmt.Sprintf("long line %d ", i)), 70<<10/12)
		case i%97 == 3:
			line = fmt.Appendf(nil, "line %d with bad bytes \xff\xfe and é and \xc3", i)
		default:
			line = fmt.Appendf(nil, "line %d: %x", i, rng.Uint64())
		}
		raw = append(append(raw, line...), '\n')
		readable = append(logstream.AppendEscaped(readable, line), '\n')
	}
	return raw, readable
}

func TestLogServedWholeForEachAttempt(t *testing.T) {
	sys := startLogSystem(t)
	raw, readable := bigOutput()
	data := filepath.Join(sys.dir, "output.txt")
	if err := os.WriteFile(data, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	id := sys.enqueue(t, "print")
	sys.waitState(t, id, proto.StateDone)

	for attempt := 1; attempt <= 2; attempt++ {
		head := fmt.Sprintf("attempt %d\n", attempt)
		q := fmt.Sprintf("?attempt=%d", attempt)
		if attempt == 2 {
			q = "" // the latest attempt is the default
		}
		code, got := sys.get(t, "/jobs/"+id+"/log"+q)
		if code != http.StatusOK || !bytes.Equal(got, append([]byte(head), readable...)) {
			t.Errorf("attempt %d readable: %d, %d bytes, want %d; differs at byte %d", attempt, code, len(got), len(head)+len(readable), diffAt(got, append([]byte(head), readable...)))
		}
		rawQ := q + "&raw=1"
		if q == "" {
			rawQ = "?raw=1"
		}
		code, got = sys.get(t, "/jobs/"+id+"/log"+rawQ)
		if code != http.StatusOK || !bytes.Equal(got, append([]byte(head), raw...)) {
			t.Errorf("attempt %d raw: %d, %d bytes, want %d; differs at byte %d", attempt, code, len(got), len(head)+len(raw), diffAt(got, append([]byte(head), raw...)))
		}
	}
	if code, got := sys.get(t, "/jobs/"+id+"/log?attempt=3"); code != http.StatusOK || len(got) != 0 {
		t.Errorf("an attempt that never started: %d %q, want 200 and no body", code, got)
	}
	if code, _ := sys.get(t, "/jobs/nosuchjob/log"); code != http.StatusNotFound {
		t.Errorf("unknown job: %d, want 404", code)
	}
}

func diffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestLogFollowSeesLinesLiveAndEnds(t *testing.T) {
	sys := startLogSystem(t)
	release := filepath.Join(sys.dir, "release")
	id := sys.enqueue(t, "follow")
	sys.waitState(t, id, proto.StateRunning)

	resp := sys.request(t, http.MethodGet, "/jobs/"+id+"/log?follow=1", nil)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q", ct)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// The agent printed its first line and waits for the release file:
	// the line must arrive while it still runs. The design aims at about
	// a second; the bound is generous for a loaded machine.
	select {
	case l := <-lines:
		if l != "first line" {
			t.Fatalf("first line followed: %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent's first line did not arrive while it ran")
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var rest []string
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			if !ok {
				done = true
				break
			}
			rest = append(rest, l)
		case <-timeout:
			t.Fatalf("follow did not end with the attempt; got %q", rest)
		}
	}
	if len(rest) != 1 || rest[0] != "second line" {
		t.Errorf("after the first line: %q, want the second line and the end", rest)
	}
}

func TestAlertTailComesFromTheStream(t *testing.T) {
	sys := startLogSystem(t)
	id := sys.enqueue(t, "doomed")
	sys.waitState(t, id, proto.StateFailed)
	var msg string
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, m := range sys.telegram.Messages() {
			if strings.Contains(m.Text, id) {
				msg = m.Text
				return nil
			}
		}
		return fmt.Errorf("no alert for %s", id)
	})
	_, readable := sys.get(t, "/jobs/"+id+"/log")
	lines := strings.Split(strings.TrimRight(string(readable), "\n"), "\n")
	want := strings.Join(lines[len(lines)-3:], "\n")
	if !strings.Contains(msg, "<pre>") || !strings.Contains(msg, want+"</pre>") {
		t.Errorf("alert does not end with the log's last lines %q:\n%s", want, msg)
	}
	if !strings.Contains(msg, "FINAL: assertion failed in attempt 2") || strings.Contains(msg, "not readable here") {
		t.Errorf("alert tail is not the last attempt's, read from the stream:\n%s", msg)
	}
	if !strings.Contains(msg, "https://orch.example.com/ui/jobs/"+id) {
		t.Errorf("alert does not link to the job's page:\n%s", msg)
	}
}
