package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/agent"
)

// runnerProcessEnv makes the test binary a runner process (TestMain): the
// SIGKILL test needs a real process to kill.
const runnerProcessEnv = "ORCH_TEST_RUNNER_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(runnerProcessEnv) == "1" {
		var cfg runner.Config
		if err := service.FromEnv(&cfg); err != nil {
			service.Fatal(err)
		}
		log, err := zap.NewDevelopment()
		if err != nil {
			service.Fatal(err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err = runner.Run(ctx, cfg, log)
		stop()
		if err != nil {
			service.Fatal(err)
		}
		os.Exit(0)
	}
	natstest.VerifyTestMain(m)
}

// env is one test's world: a JetStream server, a git remote, a registry.
type env struct {
	t        *testing.T
	dir      string
	srv      *embedded.Server
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	status   *status.Store
	remote   string
	projects string
	runs     string // where agents record their runs
}

func newEnv(t *testing.T, projectExtra string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, srv: natstest.Server(t), remote: filepath.Join(dir, "remote"), runs: filepath.Join(dir, "runs")}
	_, e.js, e.kv = natstest.Connect(t, e.srv)
	e.status = status.New(e.kv)
	if err := os.MkdirAll(e.runs, 0o755); err != nil {
		t.Fatal(err)
	}
	e.projects, e.remote = testkit.Project(t, dir, projectExtra)
	return e
}

// script writes an agent script; in it $RUNS is the runs directory.
func (e *env) script(body string) string {
	return testkit.AgentScript(e.t, e.dir, fmt.Sprintf("agent-%d.sh", time.Now().UnixNano()), "RUNS="+e.runs+"\n"+body)
}

// config is a runner configuration with short timings for tests.
func (e *env) config(name, agentCommand string) runner.Config {
	return runner.Config{
		Common:         service.Common{NATSURL: e.srv.URL(), DataDir: e.dir},
		ProjectsFile:   e.projects,
		MaxConcurrency: 1,
		MaxAttempts:    3,
		RetryDelay:     100 * time.Millisecond,
		RetryMaxDelay:  2 * time.Second,
		AgentCommand:   agentCommand,
		AgentTimeout:   time.Minute,
		WorkspaceDir:   filepath.Join(e.dir, "ws-"+name),
		ShutdownGrace:  time.Second,
		// Short, so redeliveries come quickly, yet long enough that a
		// heartbeat on a loaded 2-core machine under -race stays within
		// the lease (2/3 of it): a lost lease reruns a job.
		AckWait:   3 * time.Second,
		KillGrace: 200 * time.Millisecond,
		Name:      name,
		// Stand-in agents record their runs outside their worktree and
		// read the transcripts of agent/testdata: a confined agent (auto
		// picks bubblewrap where it works) may too.
		AgentSandboxRW: []string{e.runs},
		AgentSandboxRO: []string{testdataDir(e.t)},
	}
}

// start runs a runner until the returned stop is called (or the test ends).
func (e *env) start(cfg runner.Config) (stop func()) {
	return e.startLogged(cfg, nil)
}

// startLogged is start with the runner's log also going to extra, when
// it is not nil, for tests that check what was logged.
func (e *env) startLogged(cfg runner.Config, extra zapcore.Core) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	log := zaptest.NewLogger(e.t, zaptest.Level(zap.InfoLevel))
	if extra != nil {
		log = zap.New(zapcore.NewTee(log.Core(), extra))
	}
	log = log.Named(cfg.Name)
	go func() {
		defer close(done)
		if err := runner.Run(ctx, cfg, log); err != nil {
			e.t.Errorf("runner %s: %v", cfg.Name, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(stop)
	return stop
}

// process is a runner running as a child process of the test, so that a
// test can SIGKILL it.
type process struct {
	t   *testing.T
	cmd *exec.Cmd
	log string
}

// startProcess starts the test binary as a runner process (see TestMain)
// named name, running agentCommand, with the test's settings and then
// vars (ORCH_NAME=value) on top. Its log is shown if the test fails.
func (e *env) startProcess(name, agentCommand string, vars ...string) *process {
	e.t.Helper()
	p := &process{t: e.t, cmd: exec.Command(os.Args[0]), log: filepath.Join(e.dir, "runner-"+name+".log")}
	p.cmd.Env = append(append(os.Environ(), runnerProcessEnv+"=1",
		"ORCH_NATS_URL="+e.srv.URL(), "ORCH_DATA_DIR="+e.dir, "ORCH_PROJECTS_FILE="+e.projects,
		"ORCH_AGENT_COMMAND="+agentCommand, "ORCH_WORKSPACE_DIR="+filepath.Join(e.dir, "ws-"+name),
		"ORCH_RUNNER_NAME="+name, "ORCH_RETRY_DELAY=100ms", "ORCH_LOG_FORMAT=console", "ORCH_AGENT_SANDBOX_RW="+e.runs, "ORCH_AGENT_SANDBOX_RO="+testdataDir(e.t),
		// Any free port: runner processes run side by side.
		"ORCH_HTTP_ADDR=127.0.0.1:0"), vars...)
	logf, err := os.Create(p.log)
	if err != nil {
		e.t.Fatal(err)
	}
	defer logf.Close() // the child has its own copy
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.kill()
		}
		if e.t.Failed() {
			data, _ := os.ReadFile(p.log)
			e.t.Logf("runner process %s log:\n%s", name, data)
		}
	})
	return p
}

// kill SIGKILLs the runner process and reaps it.
func (p *process) kill() {
	if err := p.cmd.Process.Signal(os.Kill); err != nil {
		p.t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// job makes a job of task and kind.
func job(id, task string, kind proto.Kind) *proto.Job {
	return &proto.Job{Schema: proto.SchemaVersion, ID: proto.JobID(id), Kind: kind, Project: "widgets",
		Task: proto.Task{ID: task, Title: "Title of " + task, Body: "Body of " + task}, Source: proto.Source{System: "api"},
		CreatedAt: time.Now().UTC()}
}

// enqueue does what the gateway does: publish with dedupe, record queued.
func (e *env) enqueue(j *proto.Job) {
	e.t.Helper()
	data, _ := json.Marshal(j)
	ctx := context.Background()
	if _, err := e.js.Publish(ctx, proto.JobSubject(j.Project, j.Kind), data, jetstream.WithMsgID(j.ID)); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.status.Apply(ctx, j, status.Queue(0)); err != nil && !errors.Is(err, status.ErrExists) {
		e.t.Fatal(err)
	}
}

func (e *env) waitState(id string, want proto.State, timeout time.Duration) *proto.Status {
	e.t.Helper()
	var st *proto.Status
	natstest.CheckFor(e.t, timeout, 20*time.Millisecond, func() error {
		var err error
		st, _, err = e.status.Get(context.Background(), id)
		if err != nil {
			return err
		}
		if st.State != want {
			return fmt.Errorf("job %s is %s (%s), want %s", id, st.State, st.Error, want)
		}
		return nil
	})
	return st
}

// waitStreamEmpty waits until JOBS holds no message: every job settled.
func (e *env) waitStreamEmpty(timeout time.Duration) {
	e.t.Helper()
	natstest.CheckFor(e.t, timeout, 20*time.Millisecond, func() error {
		s, err := e.js.Stream(context.Background(), proto.StreamJobs)
		if err != nil {
			return err
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("JOBS holds %d messages", info.State.Msgs)
		}
		return nil
	})
}

// lines returns the lines of a file under runs, none if it is missing.
func (e *env) lines(name string) []string {
	data, err := os.ReadFile(filepath.Join(e.runs, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(data), "\n", " "))
}

// pid is the process id an agent wrote into the file name under runs, as
// the host sees it: a confined agent's $$ is its pid in the sandbox's own
// pid namespace (see hostPid).
func (e *env) pid(name string) int {
	e.t.Helper()
	return hostPid(e.t, e.dir, testkit.ReadPid(e.t, filepath.Join(e.runs, name)))
}

// hostPid is the host's pid of the live process that is pid in its own
// pid namespace and whose environment names dir (the test's directory,
// in ORCH_TASK_FILE, which every process of a test's agent inherits); pid
// itself when that is a process of the host's namespace, as an
// unconfined agent's is.
//
// A pid file written right after a fork ("sleep 300 & echo $! > f") may
// name a process still in its exec, whose environment reads empty for a
// moment: it is looked for again until it is found, for 10 s at most.
func hostPid(t *testing.T, dir string, pid int) int {
	t.Helper()
	var host int
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if host = findHostPid(dir, pid); host == 0 {
			return fmt.Errorf("no live process is pid %d of a sandbox of this test's", pid)
		}
		return nil
	})
	return host
}

// findHostPid is hostPid's one look through /proc; 0 when none is found.
func findHostPid(dir string, pid int) int {
	if len(nsPids(pid)) == 1 && strings.Contains(environ(pid), dir) {
		return pid
	}
	found := processes(func(host int) bool {
		ns := nsPids(host)
		return len(ns) >= 2 && ns[len(ns)-1] == pid && strings.Contains(environ(host), dir)
	})
	if len(found) == 0 {
		return 0
	}
	return found[0]
}

// processes lists the processes in /proc for which keep is true.
func processes(keep func(pid int) bool) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && keep(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// environ is pid's environment as /proc has it, NUL-separated; "" when
// it cannot be read.
func environ(pid int) string {
	env, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	return string(env)
}

// nsPids is the NSpid line of /proc/<pid>/status: the process's pid in
// each pid namespace from the host's down to its own; nil when there is
// no such process.
func nsPids(pid int) []int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(rest) {
				n, _ := strconv.Atoi(f)
				out = append(out, n)
			}
			return out
		}
	}
	return nil
}

// testdataDir is agent/testdata, the transcripts stand-in agents print.
func testdataDir(t testing.TB) string {
	d, err := filepath.Abs(filepath.Join("agent", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The overlap tracker. Agents made with trackedAgent write, per run, a file
// runs/run.<job>.<attempt>.<pid> with "start <ns>" and, if they finish,
// "end <ns>". A run killed before its end is closed when the tracker sees
// its process gone. The maximum number of runs open at once is the
// overlap.
const trackedAgent = `f=$RUNS/run.$ORCH_JOB_ID.$ORCH_ATTEMPT.$$
echo "start $(date +%s%N)" > $f
sleep "$SLEEP"
echo "end $(date +%s%N)" >> $f
`

type tracker struct {
	e    *env
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	gone map[string]int64 // run file → when its process was seen gone
}

func (e *env) track() *tracker {
	tr := &tracker{e: e, stop: make(chan struct{}), done: make(chan struct{}), gone: map[string]int64{}}
	go func() {
		defer close(tr.done)
		for {
			select {
			case <-tr.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			tr.poll()
		}
	}()
	e.t.Cleanup(tr.close)
	return tr
}

func (tr *tracker) close() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	<-tr.done
}

func (tr *tracker) poll() {
	files, _ := filepath.Glob(filepath.Join(tr.e.runs, "run.*"))
	for _, f := range files {
		tr.mu.Lock()
		_, seen := tr.gone[f]
		tr.mu.Unlock()
		if seen {
			continue
		}
		data, _ := os.ReadFile(f)
		if strings.Contains(string(data), "end ") {
			continue
		}
		if !runAlive(filepath.Base(f)) {
			now := time.Now().UnixNano()
			tr.mu.Lock()
			tr.gone[f] = now
			tr.mu.Unlock()
		}
	}
}

// runAlive reports whether a process of the run that wrote the run file
// name (run.<job>.<attempt>.<pid>) is alive: one whose environment has
// that job and attempt. A confined agent's pid is of its sandbox's pid
// namespace, so the pid alone does not tell.
func runAlive(name string) bool {
	parts := strings.Split(name, ".")
	if len(parts) != 4 {
		return false
	}
	job, attempt := "ORCH_JOB_ID="+parts[1]+"\x00", "ORCH_ATTEMPT="+parts[2]+"\x00"
	return len(processes(func(pid int) bool {
		env := environ(pid)
		return strings.Contains(env, job) && strings.Contains(env, attempt) && agent.Alive(pid)
	})) > 0
}

// result returns the maximum overlap and, per job, how many runs finished.
func (tr *tracker) result() (maxOverlap int, finished map[string]int) {
	tr.close()
	tr.poll()
	type event struct {
		at    int64
		delta int
	}
	var events []event
	finished = map[string]int{}
	files, _ := filepath.Glob(filepath.Join(tr.e.runs, "run.*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		var start, end int64
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "start "); ok {
				start, _ = strconv.ParseInt(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(line, "end "); ok {
				end, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if end > 0 {
			finished[strings.Split(filepath.Base(f), ".")[1]]++
		} else if g, ok := tr.gone[f]; ok {
			end = g
		} else {
			tr.e.t.Errorf("run %s neither ended nor died", f)
			continue
		}
		events = append(events, event{start, +1}, event{end, -1})
	}
	sort.Slice(events, func(i, j int) bool {
		if events[i].at != events[j].at {
			return events[i].at < events[j].at
		}
		return events[i].delta < events[j].delta // ends first
	})
	cur := 0
	for _, ev := range events {
		cur += ev.delta
		maxOverlap = max(maxOverlap, cur)
	}
	return maxOverlap, finished
}
