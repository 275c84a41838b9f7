package soak

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/natscluster"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/proto"
)

// The cluster soak's chaos, beside the runner kills of make soak's.
var (
	// fullPace is make soak-cluster's: a server SIGKILLed every 20 s and
	// down for 5 s (long enough for the leaders it held to move), one
	// server cut off for 30 s, webhooks at 5 a second.
	fullPace = pace{serverEvery: 20 * time.Second, downFor: 5 * time.Second, partitionFor: 30 * time.Second, rate: 5}
	// shortPace is the short run's, in make test: the same chaos, faster.
	shortPace = pace{serverEvery: 8 * time.Second, downFor: 3 * time.Second, partitionFor: 10 * time.Second, rate: 10}
)

// clusterShortN is the short run's number of jobs (no ORCH_SOAK_CLUSTER_N).
const clusterShortN = 200

// pace is how often the cluster soak's chaos strikes.
type pace struct {
	// serverEvery is how often a server is SIGKILLed, downFor how long
	// it stays down.
	serverEvery, downFor time.Duration
	// partitionFor is how long one server is cut off from the other two,
	// once, when half the chaos phase's webhooks are posted.
	partitionFor time.Duration
	// rate is the webhooks' default pace, per second.
	rate float64
}

// leaderTargets are the groups whose leader is killed on every other
// round: the jobs, the runners' consumer of them, the status records and
// the task locks.
var leaderTargets = []struct{ stream, consumer string }{
	{proto.StreamJobs, ""},
	{proto.StreamJobs, proto.ConsumerRunner},
	{"KV_" + proto.BucketJobs, ""},
	{proto.StreamTaskLocks, ""},
}

func targetName(stream, consumer string) string {
	if consumer != "" {
		return stream + "/" + consumer
	}
	return stream
}

// clusterChaos is the cluster soak's servers and what was done to them.
type clusterChaos struct {
	c *natscluster.Cluster
	pace

	mu         sync.Mutex
	kills      []serverKill
	partitions []serverKill
	// replicas holds a stream that is not R3, with its replicas.
	replicas map[string]int
}

// serverKill is one server taken away: SIGKILLed (or cut off) at from,
// back at up, current again (healthy) at to.
type serverKill struct {
	server string
	// leader names the group it led and was chosen for ("" on a round in
	// turn).
	leader       string
	from, up, to time.Time
}

func (k serverKill) window() window {
	to := k.to
	if to.IsZero() {
		to = time.Now()
	}
	return window{k.from, to}
}

// windows are the outages: each kill and partition until the server was
// current again.
func (cc *clusterChaos) windows() []window {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var out []window
	for _, k := range append(slices.Clone(cc.kills), cc.partitions...) {
		out = append(out, k.window())
	}
	return out
}

// TestSoakCluster is make soak on a three-server JetStream cluster that
// keeps losing servers: every stream and bucket R3, the services logged in
// as their kit/natsauth users and given all three URLs, two runners
// SIGKILLed as TestSoak kills them, a server SIGKILLed and restarted every
// serverEvery (the leader of JOBS, of the runners' consumer, of KV jobs or
// of the task locks on every other round), and one server cut off from
// the others for partitionFor. The webhooks come at ORCH_SOAK_RATE a
// second (default 5).
//
// With ORCH_SOAK_CLUSTER_SHORT=1 instead it is a short run of
// clusterShortN jobs at shortPace; with neither it is skipped.
func TestSoakCluster(t *testing.T) {
	total, p := clusterShortN, shortPace
	if n, ok := os.LookupEnv("ORCH_SOAK_CLUSTER_N"); ok {
		var err error
		if total, err = strconv.Atoi(n); err != nil || total < 1 {
			t.Fatalf("ORCH_SOAK_CLUSTER_N=%q: want a positive number", n)
		}
		p = fullPace
	} else if os.Getenv("ORCH_SOAK_CLUSTER_SHORT") == "" {
		// Out of make test: on a shared 2-core machine the short run
		// takes two to six minutes, past make test's budget for it.
		t.Skip("make soak-cluster runs it (ORCH_SOAK_CLUSTER_N); ORCH_SOAK_CLUSTER_SHORT=1 runs the short version")
	}
	rate := p.rate
	var err error
	if v := os.Getenv("ORCH_SOAK_RATE"); v != "" {
		if rate, err = strconv.ParseFloat(v, 64); err != nil || rate < 0 {
			t.Fatalf("ORCH_SOAK_RATE=%q: want a number of webhooks a second, 0 for no pace", v)
		}
	}
	calmN := max(total/10, 20)
	sys := newClusterSystem(t, p)
	sys.rate = rate
	t.Logf("soak: %d jobs at %.1f/s (%d before the chaos) on a 3-server cluster, 2 runners, concurrency %d, %d attempts",
		total, rate, calmN, maxConcurrency, maxAttempts)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var posted atomic.Int64
	tracker := newTracker()

	calmStart := time.Now()
	calm, err := sys.post(ctx, 0, calmN, total, &posted)
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
	chaos.Go(func() { sys.chaos(chaosCtx, &posted, int64(calmN), int64(total)) })
	chaos.Go(func() { sys.cluster.run(chaosCtx, sys, &posted, int64(calmN), int64(total)) })
	chaos.Go(func() { sys.sampleSpool(chaosCtx) })
	defer func() { stopChaos(); chaos.Wait() }()
	rest, err := sys.post(ctx, calmN, total, total, &posted)
	if err != nil {
		t.Errorf("posting: %v", err)
	}
	tracker.add(rest)
	t.Logf("soak: %d webhooks accepted after %v", len(calm)+len(rest), time.Since(sys.started).Round(time.Millisecond))

	// The chaos goes on while the last jobs drain; the deadline is what
	// a quarter of the calm rate would take, plus two minutes for a
	// server's return and the AckWait tails.
	settleTimeout := 2*time.Minute + time.Duration(4*float64(len(rest))/calmRate*float64(time.Second))
	if d, ok := t.Deadline(); ok {
		settleTimeout = min(settleTimeout, time.Since(chaosStart)+time.Until(d)-4*time.Minute)
	}
	if err := sys.settle(ctx, tracker, settleTimeout-time.Since(chaosStart)); err != nil {
		t.Errorf("jobs did not settle within %v: %v", settleTimeout.Round(time.Second), err)
	}
	chaosRate := float64(len(rest)) / time.Since(chaosStart).Seconds()
	stopChaos()
	chaos.Wait()
	// The last server taken away comes back before the counts are read.
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Minute)
	if err := sys.cluster.c.WaitHealthy(hctx); err != nil {
		t.Errorf("after the chaos: %v", err)
	}
	hcancel()
	queue, lag := sys.queueAgrees(tracker)
	sys.stopAll()

	jobs := append(calm, rest...)
	rep := sys.check(jobs, queue, lag)
	rep.elapsed = time.Since(sys.started)
	rep.calmRate, rep.chaosRate = calmRate, chaosRate
	rep.print(os.Stdout)
	sys.cluster.print(os.Stdout, sys.dir)
	for _, p := range rep.problems {
		t.Error(p)
	}
}

// newClusterSystem starts the cluster (nats-server built from the module,
// logins from kit/natsauth's table) and the services on it, each with
// ORCH_STREAM_REPLICAS=3, its own NATS user and all three URLs.
func newClusterSystem(t *testing.T, p pace) *system {
	sys := prepare(t)
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Minute)
	bin, err := natscluster.Build(bctx, filepath.Join(sys.dir, "bin"))
	bcancel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	passwords := map[string]string{}
	for _, u := range natsauth.Users() {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		passwords[u] = hex.EncodeToString(b)
	}
	dir := filepath.Join(sys.dir, "nats")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := natscluster.Start(ctx, natscluster.Options{Bin: bin, Dir: dir, Passwords: passwords})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	sys.cluster = &clusterChaos{c: c, pace: p, replicas: map[string]int{}}
	sys.natsURL = c.URL()
	sys.natsEnv = func(service string) []string {
		return []string{"ORCH_NATS_USER=" + service, "ORCH_NATS_PASSWORD=" + passwords[service], "ORCH_STREAM_REPLICAS=3"}
	}
	sys.connect(ctx, proto.Topology{Replicas: 3}, nats.UserInfo(natsauth.Admin, passwords[natsauth.Admin]))
	sys.startServices(ctx)
	sys.cluster.checkReplicas(ctx, sys.js)
	return sys
}

// checkReplicas notes every stream (the buckets' included) that is not R3
// once the services have made theirs.
func (cc *clusterChaos) checkReplicas(ctx context.Context, js jetstream.JetStream) {
	names := js.StreamNames(ctx)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	n := 0
	for name := range names.Name() {
		n++
		s, err := js.Stream(ctx, name)
		if err != nil {
			cc.replicas[name] = -1
			continue
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			cc.replicas[name] = r
		}
	}
	if n == 0 {
		cc.replicas["(no stream listed)"] = 0
	}
}

// run SIGKILLs a server every serverEvery and starts it again downFor
// later, never while another is down or behind (so every group keeps its
// quorum); on every other round the victim is the leader of one of
// leaderTargets in turn, else the next server in turn. Once, when half
// the chaos phase's webhooks are posted and two servers were killed, the
// next server in turn is cut off from the others for partitionFor
// instead. Until ctx ends.
func (cc *clusterChaos) run(ctx context.Context, sys *system, posted *atomic.Int64, from, n int64) {
	servers := cc.c.Servers()
	round, turn := 0, 0
	partitioned := false
	next := time.Now().Add(cc.serverEvery)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		// Never two away: the last one must be current again first.
		if err := cc.c.WaitHealthy(ctx); err != nil {
			if ctx.Err() == nil {
				sys.t.Errorf("cluster not healthy before round %d: %v", round, err)
			}
			return
		}
		next = time.Now().Add(cc.serverEvery)
		if !partitioned && round >= 2 && posted.Load() >= from+(n-from)/2 {
			partitioned = true
			victim := servers[turn%len(servers)]
			turn++
			cc.partition(ctx, sys, victim)
			next = time.Now().Add(cc.serverEvery)
			continue
		}
		victim := servers[turn%len(servers)]
		leader := ""
		if round%2 == 0 {
			tg := leaderTargets[(round/2)%len(leaderTargets)]
			if name, err := groupLeader(ctx, sys.js, tg.stream, tg.consumer); err == nil && cc.c.Server(name) != nil {
				victim, leader = cc.c.Server(name), targetName(tg.stream, tg.consumer)
			} else {
				sys.t.Logf("soak: no leader of %s to kill (%v): killing %s in turn", targetName(tg.stream, tg.consumer), err, victim.Name)
				turn++
			}
		} else {
			turn++
		}
		round++
		cc.kill(ctx, sys, victim, leader)
	}
}

// kill SIGKILLs s, starts it again downFor later and waits until it is
// current.
func (cc *clusterChaos) kill(ctx context.Context, sys *system, s *natscluster.Server, leader string) {
	k := serverKill{server: s.Name, leader: leader, from: time.Now()}
	cc.c.Kill(s)
	cc.mu.Lock()
	cc.kills = append(cc.kills, k)
	i := len(cc.kills) - 1
	cc.mu.Unlock()
	what := "in turn"
	if leader != "" {
		what = "leader of " + leader
	}
	sys.t.Logf("soak: %v: SIGKILLed %s (%s)", k.from.Sub(sys.started).Round(time.Millisecond), s.Name, what)
	select {
	case <-ctx.Done():
	case <-time.After(cc.downFor):
	}
	if err := cc.c.Restart(s); err != nil {
		sys.t.Errorf("restarting %s: %v", s.Name, err)
		return
	}
	up := time.Now()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	err := cc.c.WaitHealthy(hctx)
	cc.mu.Lock()
	cc.kills[i].up, cc.kills[i].to = up, time.Now()
	cc.mu.Unlock()
	if err != nil {
		sys.t.Errorf("%s did not catch up: %v", s.Name, err)
		return
	}
	sys.t.Logf("soak: %s back after %v, current after %v", s.Name, up.Sub(k.from).Round(time.Millisecond), time.Since(k.from).Round(time.Millisecond))
}

// partition cuts s off from the other servers for partitionFor, heals it
// and waits until it is current.
func (cc *clusterChaos) partition(ctx context.Context, sys *system, s *natscluster.Server) {
	k := serverKill{server: s.Name, from: time.Now()}
	cc.c.Partition(s, true)
	cc.mu.Lock()
	cc.partitions = append(cc.partitions, k)
	i := len(cc.partitions) - 1
	cc.mu.Unlock()
	sys.t.Logf("soak: %v: cut %s off from the cluster", k.from.Sub(sys.started).Round(time.Millisecond), s.Name)
	select {
	case <-ctx.Done():
	case <-time.After(cc.partitionFor):
	}
	cc.c.Partition(s, false)
	up := time.Now()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	err := cc.c.WaitHealthy(hctx)
	cc.mu.Lock()
	cc.partitions[i].up, cc.partitions[i].to = up, time.Now()
	cc.mu.Unlock()
	if err != nil {
		sys.t.Errorf("%s did not catch up after the partition: %v", s.Name, err)
		return
	}
	sys.t.Logf("soak: %s rejoined, current after %v", s.Name, time.Since(up).Round(time.Millisecond))
}

// groupLeader names the server that leads stream (or its consumer).
func groupLeader(ctx context.Context, js jetstream.JetStream, stream, consumer string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var cl *jetstream.ClusterInfo
	if consumer != "" {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return "", err
		}
		cl = c.CachedInfo().Cluster
	} else {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return "", err
		}
		cl = s.CachedInfo().Cluster
	}
	if cl == nil || cl.Leader == "" {
		return "", fmt.Errorf("%s has no leader", targetName(stream, consumer))
	}
	return cl.Leader, nil
}

// check adds the cluster's own problems to r: streams not R3, a
// permission refused to a service, chaos that did not happen.
func (cc *clusterChaos) check(r *report, dir string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, name := range []string{"gateway", "notifier", "r1", "r2"} {
		if n := violations(filepath.Join(dir, name+".log")); n > 0 {
			r.problem("%s: NATS refused it a subject %d times (see %s.log): a permission of kit/natsauth's table is missing", name, n, name)
		}
	}
	for name, n := range cc.replicas {
		r.problem("stream %s has %d replicas, want 3 (ORCH_STREAM_REPLICAS=3)", name, n)
	}
	if len(cc.kills) == 0 {
		r.problem("chaos incomplete: no server was killed")
	}
	if r.kills == 0 {
		r.problem("chaos incomplete: no runner was killed")
	}
	// Every leader target was a victim, once there were rounds enough.
	if len(cc.kills) >= 2*len(leaderTargets) {
		for _, tg := range leaderTargets {
			name := targetName(tg.stream, tg.consumer)
			if !slices.ContainsFunc(cc.kills, func(k serverKill) bool { return k.leader == name }) {
				r.problem("chaos incomplete: the leader of %s was never killed", name)
			}
		}
	}
}

// violations counts the lines of a service's log where NATS refused it a
// subject: the permissions of kit/natsauth must hold on every server and
// across every failover.
func violations(logPath string) int {
	data, _ := os.ReadFile(logPath)
	return bytes.Count(bytes.ToLower(data), []byte("permissions violation"))
}

// countLines counts the lines of the runners' logs that hold what.
func countLines(dir, what string) int {
	n := 0
	for _, name := range []string{"r1", "r2"} {
		data, _ := os.ReadFile(filepath.Join(dir, name+".log"))
		n += bytes.Count(data, []byte(what))
	}
	return n
}

func (cc *clusterChaos) print(w io.Writer, dir string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	leaders := map[string]int{}
	var longest, caughtUp time.Duration
	for _, k := range cc.kills {
		if k.leader != "" {
			leaders[k.leader]++
		}
		longest = max(longest, k.to.Sub(k.up))
		caughtUp += k.to.Sub(k.up)
	}
	fmt.Fprintf(w, "  cluster                %d server SIGKILLs (%d down for %v each), leaders killed: %v\n",
		len(cc.kills), len(cc.kills), cc.downFor, leaders)
	if len(cc.kills) > 0 {
		fmt.Fprintf(w, "                         a restarted server current again after %v on average, %v at most\n",
			(caughtUp / time.Duration(len(cc.kills))).Round(time.Millisecond), longest.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  runners                %d leases lost (no confirmed heartbeat within 2/3 of ORCH_ACK_WAIT=%v), %d stale task locks taken over\n",
		countLines(dir, `"msg":"lease lost: stopping the job"`), ackWait, countLines(dir, `"msg":"took over a stale task lock"`))
	for _, p := range cc.partitions {
		fmt.Fprintf(w, "  partition              %s cut off for %v, current %v after it was healed\n",
			p.server, p.up.Sub(p.from).Round(time.Second), p.to.Sub(p.up).Round(time.Millisecond))
	}
}
