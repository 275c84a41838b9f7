package soak

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
)

//go:embed agent.sh
var agentScript []byte

// The soak's settings. Short AckWait and retry delays make SIGKILL
// redeliveries and retries come back within seconds. AckWait is not
// shorter than 3s: a heartbeat must be confirmed within 2/3 of it, and on
// a loaded 2-core machine a shorter lease is lost to scheduling alone,
// which reruns a job with no kill or restart to explain it.
const (
	shortN         = 300
	maxConcurrency = 4
	maxAttempts    = 4
	ackWait        = 3 * time.Second
	killEvery      = 4 * time.Second
	senders        = 4
	doomedEvery    = 33 // one job in 33 fails on every attempt
	// jobsPerTask is how many jobs share a task (and so its worktree and
	// lock), about what one work item sees: implement, review, fixes.
	jobsPerTask = 5
)

// soakProjects are the soak's projects, its jobs spread over them in
// turn, with their max_concurrency (0: only ORCH_MAX_CONCURRENCY); the
// check holds each to its limit.
var soakProjects = []struct {
	key, repo string
	limit     int
}{{"widgets", gitea.Repo, 0}, {"gadgets", "acme/gadgets", 1}, {"gizmos", "acme/gizmos", 2}}

var jobIDPattern = regexp.MustCompile(`[0-9a-f]{24}`)

// alerts counts the messages naming each job id.
func alerts(tg *testkit.Telegram) (map[string]int, int) {
	msgs := tg.Messages()
	out := map[string]int{}
	for _, m := range msgs {
		seen := map[string]bool{}
		for _, id := range jobIDPattern.FindAllString(m.Text, -1) {
			if !seen[id] {
				seen[id] = true
				out[id]++
			}
		}
	}
	return out, len(msgs)
}

// system is the soak's world: the server in this process (or the cluster
// of cluster_test.go), the services as child processes.
type system struct {
	t        *testing.T
	dir      string
	bins     map[string]string
	registry string
	records  string
	agent    string
	srv      *embedded.Server
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	tg       *testkit.Telegram
	gateway  string
	// natsURL is every service's ORCH_NATS_URL; natsEnv, if set, adds a
	// service's NATS settings (its login, the replicas).
	natsURL string
	natsEnv func(service string) []string
	// rate paces the webhooks, per second; 0 posts them as fast as the
	// senders go.
	rate float64
	// cluster is the cluster soak's servers and their chaos; nil on one
	// server.
	cluster *clusterChaos

	mu     sync.Mutex
	procs  map[string]*proc.Proc // by service name: gateway, notifier, r1, r2
	gen    map[string]int        // incarnations of each runner
	ended  map[string]time.Time  // incarnation tag -> when it was killed or stopped
	killed map[string]bool       // incarnation tags that were SIGKILLed
	kills  int
	jsDown []window // JetStream restarts
	// spoolPeak is the deepest the gateway's spool was seen (sampleSpool).
	spoolPeak int
	client    *http.Client
	started   time.Time
}

type window struct{ from, to time.Time }

func soakN(t *testing.T) int {
	if v := os.Getenv("ORCH_SOAK_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("ORCH_SOAK_N=%q: want a positive number", v)
		}
		return n
	}
	return shortN
}

func TestSoak(t *testing.T) {
	n := soakN(t)
	calmN := max(n/10, 50)
	sys := newSystem(t)
	t.Logf("soak: %d jobs (%d before the chaos), 2 runners, concurrency %d, %d attempts", n, calmN, maxConcurrency, maxAttempts)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var posted atomic.Int64
	tracker := newTracker()

	// The calm phase: calmN jobs drained with no kill and no restart, to
	// measure the drain rate that the chaos phase is held against and its
	// deadline derived from.
	calmStart := time.Now()
	calm, err := sys.post(ctx, 0, calmN, n, &posted)
	if err != nil {
		t.Errorf("posting: %v", err)
	}
	tracker.add(calm)
	if err := sys.settle(ctx, tracker, 2*time.Minute+time.Duration(calmN)*100*time.Millisecond); err != nil {
		t.Fatalf("calm jobs did not settle: %v", err)
	}
	calmRate := float64(len(calm)) / time.Since(calmStart).Seconds()

	var chaos sync.WaitGroup
	chaosCtx, stopChaos := context.WithCancel(ctx)
	chaosStart := time.Now()
	chaos.Go(func() { sys.chaos(chaosCtx, &posted, int64(calmN), int64(n)) })
	chaos.Go(func() { sys.sampleSpool(chaosCtx) })
	defer func() { stopChaos(); chaos.Wait() }()
	rest, err := sys.post(ctx, calmN, n, n, &posted)
	if err != nil {
		t.Errorf("posting: %v", err)
	}
	tracker.add(rest)
	t.Logf("soak: %d webhooks accepted after %v", len(calm)+len(rest), time.Since(sys.started).Round(time.Millisecond))

	// The deadline allows a quarter of the calm rate (the target is half)
	// plus a minute for the JetStream restart and AckWait tails.
	settleTimeout := time.Minute + time.Duration(4*float64(len(rest))/calmRate*float64(time.Second))
	// Within the test's own timeout, with time left to check and report:
	// a slow machine then gets a report of what did not settle, not a
	// goroutine dump.
	if d, ok := t.Deadline(); ok {
		settleTimeout = min(settleTimeout, time.Since(chaosStart)+time.Until(d)-3*time.Minute)
	}
	t.Logf("soak: calm drain %.1f jobs/s, chaos phase deadline %v", calmRate, settleTimeout.Round(time.Second))
	if err := sys.settle(ctx, tracker, settleTimeout-time.Since(chaosStart)); err != nil {
		t.Errorf("jobs did not settle within %v: %v", settleTimeout.Round(time.Second), err)
	}
	chaosRate := float64(len(rest)) / time.Since(chaosStart).Seconds()
	stopChaos()
	chaos.Wait()
	queue, lag := sys.queueAgrees(tracker)
	sys.stopAll()

	jobs := append(calm, rest...)
	rep := sys.check(jobs, queue, lag)
	rep.elapsed = time.Since(sys.started)
	rep.calmRate, rep.chaosRate = calmRate, chaosRate
	rep.print(os.Stdout)
	for _, p := range rep.problems {
		t.Error(p)
	}
}

func newSystem(t *testing.T) *system {
	sys := prepare(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	sys.srv, err = embedded.Start(embedded.Options{Port: -1, StoreDir: filepath.Join(sys.dir, "jetstream"), SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.srv.Shutdown)
	sys.natsURL = sys.srv.URL()
	sys.connect(ctx, proto.Topology{})
	sys.startServices(ctx)
	return sys
}

// prepare builds the binaries and makes the project, the agent and the
// fake Telegram: everything but NATS and the services.
func prepare(t *testing.T) *system {
	// ORCH_SOAK_DIR keeps the processes' logs and data for a post-mortem.
	dir := os.Getenv("ORCH_SOAK_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	sys := &system{
		t: t, dir: dir, procs: map[string]*proc.Proc{}, gen: map[string]int{},
		ended: map[string]time.Time{}, killed: map[string]bool{},
		client: &http.Client{Timeout: 10 * time.Second},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	if sys.bins, err = proc.Build(ctx, filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	if sys.registry, err = project.Setup(dir); err != nil {
		t.Fatal(err)
	}
	if err := addProjects(sys.registry); err != nil {
		t.Fatal(err)
	}
	sys.records = filepath.Join(dir, "runs")
	if err := os.MkdirAll(sys.records, 0o755); err != nil {
		t.Fatal(err)
	}
	sys.agent = filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(sys.agent, agentScript, 0o755); err != nil {
		t.Fatal(err)
	}
	sys.tg = testkit.NewTelegram(t, "123:abc")
	return sys
}

// addProjects adds to the registry at path the soak's projects after
// its first, served from the first's repository, with their limits.
func addProjects(path string) error {
	limit := func(n int) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf("    max_concurrency: %d\n", n)
	}
	if soakProjects[0].limit > 0 {
		return errors.New("the registry's first project takes no limit here")
	}
	for _, p := range soakProjects[1:] {
		if err := project.Add(path, p.key, p.repo, limit(p.limit)); err != nil {
			return err
		}
	}
	return nil
}

// connect connects the soak's own client to s.natsURL (with opts: a
// login), ensures topo (the gateway would: the services find it there)
// and keeps the JetStream handle and the status bucket. The ensure is
// retried (natstest.Ensure): a cluster may still be electing leaders.
func (s *system) connect(ctx context.Context, topo proto.Topology, opts ...nats.Option) {
	s.t.Helper()
	nc, err := nats.Connect(s.natsURL, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	s.js, _ = jetstream.New(nc)
	s.kv = natstest.Ensure(ctx, s.t, s.js, topo)
}

// startServices starts the gateway, the notifier and both runners, and
// waits until they are ready.
func (s *system) startServices(ctx context.Context) {
	t := s.t
	t.Cleanup(s.stopAll) // also on a failed start

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s.gateway = "http://" + addr
	s.start("gateway", "ORCH_HTTP_ADDR="+addr, "ORCH_GITEA_SECRET="+gitea.Secret, "ORCH_PLANE_SECRET=plane-secret",
		"ORCH_API_TOKEN="+apiToken)
	s.start("notifier", "ORCH_TELEGRAM_BOT_TOKEN=123:abc", "ORCH_TELEGRAM_CHAT_ID=42",
		"ORCH_TELEGRAM_API_URL="+s.tg.URL, "ORCH_NOTIFY_RETRY_DELAY=200ms")
	s.startRunner("r1")
	s.startRunner("r2")
	s.waitReady(ctx)
	s.started = time.Now()
}

func (s *system) env(name string) []string {
	env := proc.ServiceEnv(s.natsURL, s.dir, s.registry, name)
	if s.natsEnv != nil {
		env = append(env, s.natsEnv(serviceOf(name))...)
	}
	return env
}

func (s *system) start(name string, env ...string) {
	s.t.Helper()
	p, err := proc.Start(name, s.bins[serviceOf(name)], append(s.env(name), env...), filepath.Join(s.dir, name+".log"))
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.procs[name] = p
	s.mu.Unlock()
}

func serviceOf(name string) string {
	if name == "r1" || name == "r2" {
		return "runner"
	}
	return name
}

// startRunner starts a new incarnation of runner name; its agents are
// told the incarnation's tag, so that each run can be tied to it.
func (s *system) startRunner(name string) {
	s.mu.Lock()
	s.gen[name]++
	tag := fmt.Sprintf("%s.%d", name, s.gen[name])
	s.mu.Unlock()
	s.start(name,
		"ORCH_RUNNER_NAME="+tag,
		"ORCH_MAX_CONCURRENCY="+strconv.Itoa(maxConcurrency),
		"ORCH_MAX_ATTEMPTS="+strconv.Itoa(maxAttempts),
		"ORCH_ACK_WAIT="+ackWait.String(),
		"ORCH_RETRY_DELAY=100ms", "ORCH_RETRY_MAX_DELAY=1s", "ORCH_SHUTDOWN_GRACE=5s",
		// Below AckWait/3, so an agent whose lease is lost is gone before
		// its job can run elsewhere.
		"ORCH_AGENT_KILL_GRACE=500ms",
		"ORCH_AGENT_COMMAND=sh "+s.agent+" "+tag+" "+s.records,
		// A confined agent sees the script and writes its records.
		"ORCH_AGENT_SANDBOX_RO="+s.agent, "ORCH_AGENT_SANDBOX_RW="+s.records,
	)
}

func (s *system) tag(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%s.%d", name, s.gen[name])
}

func (s *system) proc(name string) *proc.Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[name]
}

// waitReady waits for the gateway's readiness and for both runners and the
// notifier to pull from their consumers.
func (s *system) waitReady(ctx context.Context) {
	s.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.ready(ctx)
		if err == nil {
			return
		}
		for _, name := range []string{"gateway", "notifier", "r1", "r2"} {
			if p := s.proc(name); p.Exited() {
				s.t.Fatalf("%s exited at start:\n%s", name, p.Tail(20))
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("system not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *system) ready(ctx context.Context) error {
	if err := testkit.ReadyErr(s.client, s.gateway); err != nil {
		return err
	}
	for _, c := range []struct {
		stream, consumer string
		pullers          int
	}{{proto.StreamJobs, proto.ConsumerRunner, 2}, {proto.StreamAdvisories, proto.ConsumerNotifier, 1}} {
		info, err := s.consumerInfo(ctx, c.stream, c.consumer)
		if err != nil {
			return err
		}
		if info.NumWaiting < c.pullers {
			return fmt.Errorf("consumer %s: %d waiting pulls, want %d", c.consumer, info.NumWaiting, c.pullers)
		}
	}
	return nil
}

// consumerInfo asks JetStream for the state of consumer on stream.
func (s *system) consumerInfo(ctx context.Context, stream, consumer string) (*jetstream.ConsumerInfo, error) {
	cons, err := s.js.Consumer(ctx, stream, consumer)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// chaos SIGKILLs a runner (r1 and r2 in turn) every killEvery and starts
// it again, and restarts JetStream once, when half of the jobs after the
// first from are posted and runners have been killed twice (so that work
// is in flight), until ctx ends. On a cluster the servers' chaos is
// clusterChaos.run's, and JetStream is not restarted here.
func (s *system) chaos(ctx context.Context, posted *atomic.Int64, from, n int64) {
	tick := time.NewTicker(killEvery)
	defer tick.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	restarted := false
	victim := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			s.mu.Lock()
			kills := s.kills
			s.mu.Unlock()
			if s.cluster == nil && !restarted && posted.Load() >= from+(n-from)/2 && kills >= 2 {
				restarted = true
				s.restartJetStream()
			}
		case <-tick.C:
			name := []string{"r1", "r2"}[victim%2]
			victim++
			tag := s.tag(name)
			s.proc(name).Kill()
			s.mu.Lock()
			s.ended[tag], s.killed[tag] = time.Now(), true
			s.kills++
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			s.startRunner(name)
		}
	}
}

// sampleSpool reads the gateway's spool depth from its /metrics every
// 100 ms until ctx ends, and keeps the deepest in s.spoolPeak.
func (s *system) sampleSpool(ctx context.Context) {
	for {
		if d, err := s.spoolDepth(ctx); err == nil {
			s.mu.Lock()
			s.spoolPeak = max(s.spoolPeak, d)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// spoolDepth is the gateway's orch_gateway_spool_depth.
func (s *system) spoolDepth(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.gateway+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	m := spoolDepthLine.FindSubmatch(body)
	if m == nil {
		return 0, errors.New("no orch_gateway_spool_depth in /metrics")
	}
	return strconv.Atoi(string(m[1]))
}

var spoolDepthLine = regexp.MustCompile(`(?m)^orch_gateway_spool_depth ([0-9]+)`)

func (s *system) restartJetStream() {
	from := time.Now()
	if err := s.srv.Restart(); err != nil {
		s.t.Errorf("restarting JetStream: %v", err)
	}
	s.mu.Lock()
	s.jsDown = append(s.jsDown, window{from, time.Now()})
	s.mu.Unlock()
	s.t.Logf("soak: JetStream restarted at %v (took %v)", from.Sub(s.started).Round(time.Millisecond), time.Since(from).Round(time.Millisecond))
}

// job is one accepted webhook's job.
type job struct {
	id      string
	project string
	doomed  bool
	// accepted is when the gateway answered 202; spooled says it kept
	// the webhook on disk for JetStream; refused counts the answers
	// before that 202 that were not one (or no answer at all).
	accepted time.Time
	spooled  bool
	refused  int
	// refusal is the last of those answers.
	refusal string
}

// post sends the distinct webhooks from to to (of n in all) on a few
// senders, each retried until the gateway answers 202 (it may answer 503
// while JetStream restarts), and returns the jobs they queued. With a
// rate, webhook i is sent no sooner than i/rate seconds after the first.
func (s *system) post(ctx context.Context, from, to, n int, posted *atomic.Int64) ([]job, error) {
	jobs := make([]job, to-from)
	var (
		g    errgroup.Group
		mu   sync.Mutex
		errs []error
	)
	g.SetLimit(senders)
	start := time.Now()
	for i := from; i < to; i++ {
		if s.rate > 0 {
			at := start.Add(time.Duration(float64(i-from) / s.rate * float64(time.Second)))
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(at)):
			}
		}
		g.Go(func() error {
			proj := soakProjects[i%len(soakProjects)]
			pr := gitea.PR{Number: 1 + i%max(n/jobsPerTask, 1), Seq: i, Repo: proj.repo}
			doomed := i%doomedEvery == doomedEvery-1
			if doomed {
				pr.Branch = fmt.Sprintf("agent/doomed-%d", i%5)
			}
			j, err := s.send(ctx, pr)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return nil // one failed webhook does not stop the others
			}
			j.doomed, j.project = doomed, proj.key
			jobs[i-from] = j
			posted.Add(1)
			return nil
		})
	}
	_ = g.Wait() // every sender returns nil; errs holds what failed
	var out []job
	for _, j := range jobs {
		if j.id != "" {
			out = append(out, j)
		}
	}
	return out, errors.Join(errs...)
}

// send posts pr's webhook until the gateway answers 202, and returns its
// job, with what came before that answer.
func (s *system) send(ctx context.Context, pr gitea.PR) (job, error) {
	d, err := gitea.New(pr)
	if err != nil {
		return job{}, err
	}
	deadline := time.Now().Add(time.Minute)
	var j job
	for time.Now().Before(deadline) && ctx.Err() == nil {
		req, err := d.Request(s.gateway, pr.Seq)
		if err != nil {
			return job{}, err
		}
		resp, err := s.client.Do(req.WithContext(ctx))
		if err != nil {
			j.refused++
			j.refusal = err.Error()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			j.refused++
			j.refusal = fmt.Sprintf("%d %s", resp.StatusCode, body)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var ans gitea.Accepted
		if err := json.Unmarshal(body, &ans); err != nil || len(ans.Jobs) != 1 {
			return job{}, fmt.Errorf("webhook %d answer %s: want one job", pr.Seq, body)
		}
		j.id, j.accepted, j.spooled = ans.Jobs[0].ID, time.Now(), ans.Spooled
		return j, nil
	}
	return job{}, fmt.Errorf("webhook %d never accepted: %s", pr.Seq, j.refusal)
}

func (s *system) status(ctx context.Context, id string) (*proto.Status, error) {
	e, err := s.kv.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return proto.DecodeStatus(e.Value())
}

// apiToken is the gateway's ORCH_API_TOKEN in the soak: GET /queue needs it.
const apiToken = "soak-token-of-the-orch-soak-test-run"

// queueCounts is GET /queue's counts, as an operator would see them.
func (s *system) queueCounts() map[string]int {
	var q struct {
		Counts map[string]int `json:"counts"`
	}
	req, _ := http.NewRequest(http.MethodGet, s.gateway+"/queue", nil)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Errorf("GET /queue: %v", err)
		return nil
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil {
		s.t.Errorf("GET /queue: %v", err)
	}
	return q.Counts
}

// stopAll stops every service with SIGTERM (the runners' incarnations end
// there) and reaps them.
func (s *system) stopAll() {
	s.mu.Lock()
	procs := s.procs
	s.procs = map[string]*proc.Proc{}
	s.mu.Unlock()
	for name, p := range procs {
		if p.Exited() {
			continue
		}
		if err := p.Stop(20 * time.Second); err != nil {
			s.t.Errorf("stopping %s: %v\n%s", name, err, p.Tail(10))
		}
		if serviceOf(name) == "runner" {
			s.mu.Lock()
			tag := fmt.Sprintf("%s.%d", name, s.gen[name])
			if _, ok := s.ended[tag]; !ok {
				s.ended[tag] = time.Now()
			}
			s.mu.Unlock()
		}
	}
}
