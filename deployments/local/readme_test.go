package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/runner/agent"
)

// repoRoot is where the Makefile and README.md are.
const repoRoot = "../.."

// makeDefaults reads the `export ORCH_X ?= value` lines of the Makefile:
// the environment `make run` gives the system.
func makeDefaults(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	re := regexp.MustCompile(`(?m)^export\s+(ORCH_\w+)\s*\?=\s*(.*?)\s*$`)
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = strings.ReplaceAll(m[2], "$(CURDIR)", root)
	}
	if len(out) == 0 {
		t.Fatal("no `export ORCH_... ?=` lines in the Makefile")
	}
	return out
}

// readmeBlock returns the lines of the first ```sh block after heading in
// README.md that contains has.
func readmeBlock(t *testing.T, heading, has string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no heading %q", heading)
	}
	s = s[i+1:]
	if next := strings.Index(s, "\n## "); next >= 0 {
		s = s[:next]
	}
	for {
		start := strings.Index(s, "```sh\n")
		if start < 0 {
			t.Fatalf("README.md has no sh block with %q under %q", has, heading)
		}
		s = s[start+6:]
		end := strings.Index(s, "```")
		if end < 0 {
			t.Fatalf("README.md: an sh block under %q does not end", heading)
		}
		if block := s[:end]; strings.Contains(block, has) {
			return strings.Split(strings.TrimSpace(block), "\n")
		}
		s = s[end+3:]
	}
}

// command strips a README line's comment.
func command(line string) string {
	if strings.HasPrefix(line, "#") {
		return ""
	}
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	return strings.TrimSpace(line)
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// localRun is the system as `make run` starts it, on random ports.
type localRun struct {
	dataDir string
	addr    string // the gateway, host:port
	natsURL string
	banner  *syncBuffer
	logs    *observer.ObservedLogs
	stop    func()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln := testkit.Listen(t)
	defer ln.Close()
	return ln.Addr().String()
}

// startMakeRun runs main's run with the Makefile's environment, then env
// on top (as a person would set it before `make run`), with data in
// dataDir and random ports.
func startMakeRun(t *testing.T, dataDir string, env map[string]string) *localRun {
	t.Helper()
	projects, err := os.ReadFile("projects.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The sample registry's repository lives in the data directory, not
	// in the source tree.
	projectsFile := filepath.Join(dataDir, "projects.yaml")
	if err := os.WriteFile(projectsFile, bytes.ReplaceAll(projects, []byte("./.data/"), []byte(dataDir+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	lr := &localRun{dataDir: dataDir, addr: freeAddr(t), natsURL: "nats://" + freeAddr(t), banner: &syncBuffer{}}
	for k, v := range makeDefaults(t) {
		t.Setenv(k, v)
	}
	for k, v := range map[string]string{
		"ORCH_DATA_DIR": dataDir, "ORCH_PROJECTS_FILE": projectsFile,
		"ORCH_HTTP_ADDR": lr.addr, "ORCH_NATS_URL": lr.natsURL,
		"ORCH_RETRY_DELAY": "100ms", "ORCH_API_TOKEN": "",
		"ORCH_STANDIN_EXIT": "", "ORCH_STANDIN_SLEEP": "0",
	} {
		t.Setenv(k, v)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	gw, rn, nt, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	core, logs := observer.New(zapcore.InfoLevel)
	lr.logs = logs
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	go func() { done <- run(ctx, gw, rn, nt, log, lr.banner) }()
	var once sync.Once
	lr.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(lr.stop)
	testkit.Ready(t, nil, "http://"+lr.addr, 30*time.Second)
	return lr
}

// expand makes a command of the README (or the banner) point at this run:
// localhost:8080 is the gateway, .data/ the data directory, and $(cat F)
// the content of F, as the shell would make it.
func (lr *localRun) expand(t *testing.T, line string) string {
	t.Helper()
	line = strings.ReplaceAll(line, "localhost:8080", lr.addr)
	line = strings.ReplaceAll(line, " .data/", " "+lr.dataDir+"/")
	line = strings.ReplaceAll(line, "(cat .data/", "(cat "+lr.dataDir+"/")
	return regexp.MustCompile(`\$\(cat ([^)]+)\)`).ReplaceAllStringFunc(line, func(m string) string {
		data, err := os.ReadFile(strings.TrimSuffix(strings.TrimPrefix(m, "$(cat "), ")"))
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		return strings.TrimSpace(string(data))
	})
}

// curl does what the curl command line does: -s, -H and a URL are all the
// README uses. curl itself need not be installed.
func (lr *localRun) curl(t *testing.T, line string) (int, []byte) {
	t.Helper()
	args, err := agent.SplitArgs(lr.expand(t, line))
	if err != nil || len(args) == 0 || args[0] != "curl" {
		t.Fatalf("not a curl command: %q (%v)", line, err)
	}
	req, _ := http.NewRequest(http.MethodGet, "", nil)
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-s":
		case a == "-X" && i+1 < len(args):
			req.Method = args[i+1]
			i++
		case a == "-H" && i+1 < len(args):
			k, v, _ := strings.Cut(args[i+1], ":")
			req.Header.Set(k, strings.TrimSpace(v))
			i++
		case !strings.HasPrefix(a, "-"):
			if req.URL, err = req.URL.Parse("http://" + strings.TrimPrefix(a, "http://")); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%q: the test's curl does not know %s", line, a)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// noRedirects is a browser without cookies that shows a test the
// redirects it gets.
var noRedirects = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// makeTarget runs a make command line of the README in the repository,
// with this run's environment (the test's).
func makeTarget(t *testing.T, line string) []byte {
	t.Helper()
	args, err := agent.SplitArgs(line)
	if err != nil || args[0] != "make" {
		t.Fatalf("not a make command: %q", line)
	}
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", repoRoot}, args[1:]...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s%s", line, err, out, stderr.Bytes())
	}
	return out
}

type answer struct {
	Jobs []struct {
		ID        string `json:"id"`
		Task      string `json:"task"`
		Duplicate bool   `json:"duplicate"`
	} `json:"jobs"`
}

func decodeAnswer(t *testing.T, what string, out []byte) answer {
	t.Helper()
	var a answer
	if err := json.Unmarshal(out, &a); err != nil || len(a.Jobs) != 1 {
		t.Fatalf("%s answered %s, want one job", what, out)
	}
	return a
}

// jobStatus reads GET /jobs/{id} with the token.
func (lr *localRun) jobStatus(t *testing.T, id string) proto.Status {
	t.Helper()
	code, body := lr.curl(t, `curl -s -H "Authorization: Bearer $(cat .data/api-token)" localhost:8080/jobs/`+id)
	var ans struct {
		Status proto.Status `json:"status"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || code != http.StatusOK {
		t.Fatalf("GET /jobs/%s: %d %s", id, code, body)
	}
	return ans.Status
}

func (lr *localRun) waitState(t *testing.T, id string, want proto.State) proto.Status {
	t.Helper()
	var st proto.Status
	natstest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		if st = lr.jobStatus(t, id); st.State != want {
			return fmt.Errorf("job %s is %s, want %s", id, st.State, want)
		}
		return nil
	})
	return st
}

// TestReadme runs the README's quick start and nats CLI commands, as
// written, against the system as `make run` sets it up.
func TestReadme(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the nats CLI and runs make")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	dataDir := t.TempDir()
	lr := startMakeRun(t, dataDir, nil)

	// make run prints a curl that works and, once the gateway is up, a
	// login link of the dashboard and the curl that makes another.
	var printed, link, another string
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for l := range strings.SplitSeq(lr.banner.String(), "\n") {
			switch l = strings.TrimSpace(l); {
			case strings.HasPrefix(l, "curl ") && strings.HasSuffix(l, "/queue"):
				printed = l
			case strings.HasPrefix(l, "http://") && strings.Contains(l, "/ui/login/"):
				link = l
			case strings.HasPrefix(l, "Another link: "):
				another = strings.TrimPrefix(l, "Another link: ")
			}
		}
		if link == "" || another == "" {
			return fmt.Errorf("make run printed no login link yet:\n%s", lr.banner.String())
		}
		return nil
	})
	if !strings.Contains(printed, `"Authorization: Bearer $(cat `) {
		t.Fatalf("make run printed no curl with the token:\n%s", lr.banner.String())
	}
	if code, body := lr.curl(t, printed); code != http.StatusOK || !strings.Contains(string(body), `"counts"`) {
		t.Errorf("%s: %d %s", printed, code, body)
	}
	// The token is never printed: the curls read it from its file.
	token := lr.expand(t, "$(cat .data/api-token)")
	if len(token) < gateway.APITokenMinLength || strings.Contains(lr.banner.String(), token) {
		t.Errorf("make run made a token of %d characters, or printed it:\n%s", len(token), lr.banner.String())
	}
	// The link logs a browser in, once.
	for i, want := range []int{http.StatusSeeOther, http.StatusUnauthorized} {
		resp, err := noRedirects.Get(link)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusSeeOther) != (resp.Header.Get("Set-Cookie") != "") {
			t.Errorf("use %d of the printed login link: %d, cookie %q; want %d", i+1, resp.StatusCode, resp.Header.Get("Set-Cookie"), want)
		}
	}
	if code, body := lr.curl(t, another); code != http.StatusOK || !strings.Contains(string(body), `"link":"/ui/login/`) {
		t.Errorf("%s: %d %s", another, code, body)
	}

	var id string
	t.Run("quick start", func(t *testing.T) {
		block := readmeBlock(t, "## Try it", "make sample")
		var wantID string
		for _, line := range block {
			if m := regexp.MustCompile(`^# \{"jobs":\[\{"id":"(\w+)"`).FindStringSubmatch(line); m != nil {
				wantID = m[1]
			}
		}
		for _, line := range block {
			cmd := command(line)
			switch {
			case cmd == "":
			case strings.HasPrefix(cmd, "make sample"):
				a := decodeAnswer(t, cmd, makeTarget(t, cmd))
				id = a.Jobs[0].ID
				if id != wantID || a.Jobs[0].Duplicate {
					t.Errorf("%s: job %s (duplicate %v), README says %s", cmd, id, a.Jobs[0].Duplicate, wantID)
				}
			case strings.HasPrefix(cmd, "curl "):
				if code, body := lr.curl(t, cmd); code != http.StatusOK || !strings.Contains(string(body), id) {
					t.Errorf("%s: %d %s", cmd, code, body)
				}
			default:
				t.Errorf("the test does not know how to run %q", cmd)
			}
		}
		if st := lr.waitState(t, id, proto.StateDone); st.Attempt != 1 {
			t.Errorf("sample job: %+v", st)
		}
	})

	t.Run("the sample again, and as a new event", func(t *testing.T) {
		readme, _ := os.ReadFile(filepath.Join(repoRoot, "README.md"))
		for _, want := range []string{`"duplicate": true`, "make sample SAMPLE_FLAGS=-new"} {
			if !bytes.Contains(readme, []byte(want)) {
				t.Fatalf("README.md no longer says %s", want)
			}
		}
		again := decodeAnswer(t, "make sample", makeTarget(t, "make sample"))
		if again.Jobs[0].ID != id || !again.Jobs[0].Duplicate {
			t.Errorf("make sample again: %+v, want job %s marked duplicate", again, id)
		}
		fresh := decodeAnswer(t, "make sample SAMPLE_FLAGS=-new", makeTarget(t, "make sample SAMPLE_FLAGS=-new"))
		if fresh.Jobs[0].ID == id || fresh.Jobs[0].Duplicate {
			t.Errorf("make sample SAMPLE_FLAGS=-new: %+v, want a new job", fresh)
		}
		lr.waitState(t, fresh.Jobs[0].ID, proto.StateDone)
	})
	lr.stop()

	// ORCH_STANDIN_EXIT=1 make run: the job fails for good and is alerted.
	lr = startMakeRun(t, dataDir, map[string]string{"ORCH_STANDIN_EXIT": "1"})
	var failed string
	t.Run("ORCH_STANDIN_EXIT=1 make run", func(t *testing.T) {
		failed = decodeAnswer(t, "make sample SAMPLE_FLAGS=-new", makeTarget(t, "make sample SAMPLE_FLAGS=-new")).Jobs[0].ID
		var st proto.Status
		natstest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
			if st = lr.jobStatus(t, failed); st.State != proto.StateFailed || st.DLQSeq == 0 {
				return fmt.Errorf("job %s: %s, dlq seq %d", failed, st.State, st.DLQSeq)
			}
			return nil
		})
		if st.Attempt != 3 || st.ExitCode == nil || *st.ExitCode != 1 {
			t.Errorf("failed job: attempt %d, exit code %v, want 3 (ORCH_MAX_ATTEMPTS) and 1", st.Attempt, st.ExitCode)
		}
		natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			for _, e := range lr.logs.FilterMessage("job failed for good (no Telegram configured)").All() {
				if e.ContextMap()["job"] == failed {
					return nil
				}
			}
			return fmt.Errorf("no alert logged for job %s", failed)
		})
	})

	t.Run("nats CLI", func(t *testing.T) {
		natsCLI(t, lr, failed)
	})
}

// natsCLI runs every nats command of the README's nats CLI section, as
// written but for the job id, with the nats CLI of this module's tools.
func natsCLI(t *testing.T, lr *localRun, jobID string) {
	bin := natsTool(t)
	home := t.TempDir()
	checks := map[string][]string{
		"stream ls -a":                              {proto.StreamJobs, proto.StreamDLQ, proto.StreamAdvisories, "KV_jobs"},
		"kv ls":                                     {proto.BucketJobs, proto.BucketTaskLocks},
		"stream view JOBS_DLQ":                      {jobID},
		"stream view JOBS_ADVISORIES":               {"MAX_DELIVERIES"},
		"consumer info JOBS runner":                 {"runner"},
		"kv get jobs " + jobID + " --raw":           {`"state":"failed"`},
		"kv watch jobs":                             {jobID},
		"sub 'logs." + jobID + ".>' --all":          {"logs." + jobID + ".3", "stand-in agent: job " + jobID + " attempt 3"},
		"sub 'logs." + jobID + ".3' --all -T --raw": {"stand-in agent: job " + jobID + " attempt 3"},
	}
	ran := 0
	// The CLI's login: the README's export of the context make run wrote
	// (and printed), nothing else. The server refuses a client without.
	env := []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home}
	for _, line := range readmeBlock(t, "## Inspect with the nats CLI", "nats ") {
		cmd := command(line)
		if v, ok := strings.CutPrefix(cmd, "export NATS_CONTEXT="); ok {
			v = strings.ReplaceAll(v, "$PWD/.data/", lr.dataDir+"/")
			if !strings.Contains(lr.banner.String(), "export NATS_CONTEXT="+v) {
				t.Errorf("make run did not print the README's %s:\n%s", cmd, lr.banner.String())
			}
			env = append(env, "NATS_CONTEXT="+v)
			continue
		}
		if !strings.HasPrefix(cmd, "nats ") {
			continue // go install: the test has the CLI as a tool
		}
		cmd = strings.ReplaceAll(cmd, "<job-id>", jobID)
		args, err := agent.SplitArgs(cmd)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(cmd, func(t *testing.T) {
			out := runInTerminal(t, bin, args[1:], env,
				strings.Contains(cmd, " watch ") || strings.HasSuffix(cmd, "--all"), checks[strings.TrimPrefix(cmd, "nats ")])
			for _, want := range checks[strings.TrimPrefix(cmd, "nats ")] {
				if !strings.Contains(out, want) {
					t.Errorf("%s: output lacks %q:\n%s", cmd, want, out)
				}
			}
		})
		ran++
	}
	if ran < 10 {
		t.Errorf("ran %d nats commands from the README, want its 11", ran)
	}
}

// natsTool builds the nats CLI pinned as a tool of this module (`go tool
// nats`) and returns its path.
func natsTool(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "tool", "-n", "nats").Output()
	if err != nil {
		t.Fatalf("go tool -n nats: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var path string
	for sc.Scan() {
		path = strings.TrimSpace(sc.Text())
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("go tool -n nats: %q: %v", out, err)
	}
	return path
}
