package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/notifier"
	"github.com/orch-dev/orch/services/runner"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// clusterGiteaSecret signs the test's webhooks.
const clusterGiteaSecret = "cluster-test-secret"

// orchSystem is the three services, in this process, against the cluster.
type orchSystem struct {
	gatewayURL string
	runsDir    string
}

// startOrch runs the gateway, two runners and the notifier with
// ORCH_STREAM_REPLICAS=3 and ORCH_NATS_URL naming all three nodes. The
// script agent appends a line per run to runsDir/<job id>.
func startOrch(t *testing.T, c *natstest.TestCluster) *orchSystem {
	t.Helper()
	dir := t.TempDir()
	sys := &orchSystem{runsDir: filepath.Join(dir, "runs")}
	if err := os.MkdirAll(sys.runsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	agent := testkit.AgentScript(t, dir, "agent.sh", fmt.Sprintf("echo \"$ORCH_ATTEMPT\" >> %q/\"$ORCH_JOB_ID\"\nsleep 0.3\n", sys.runsDir))
	projects, _ := testkit.Project(t, dir, "")
	common := func(name string) service.Common {
		return service.Common{NATSURL: c.URL(), StreamReplicas: 3, DataDir: filepath.Join(dir, name)}
	}
	ln := testkit.Listen(t)
	sys.gatewayURL = "http://" + ln.Addr().String()

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	runnerCfg := func(name string) runner.Config {
		return runner.Config{Common: common(name), ProjectsFile: projects, Name: name, MaxConcurrency: 4, MaxAttempts: 5,
			RetryDelay: 100 * time.Millisecond, AgentCommand: agent, AckWait: 20 * time.Second,
			ShutdownGrace: 2 * time.Second, AgentSandboxRW: []string{sys.runsDir}}
	}
	testkit.Services(t, map[string]func(context.Context) error{
		"gateway": func(ctx context.Context) error {
			return gateway.Run(ctx, gateway.Config{Common: common("gateway"), ProjectsFile: projects,
				GiteaSecret: clusterGiteaSecret, PlaneSecret: "unused", Listener: ln}, log.Named("gateway"))
		},
		"runner-1": func(ctx context.Context) error { return runner.Run(ctx, runnerCfg("runner-1"), log.Named("runner-1")) },
		"runner-2": func(ctx context.Context) error { return runner.Run(ctx, runnerCfg("runner-2"), log.Named("runner-2")) },
		"notifier": func(ctx context.Context) error {
			return notifier.Run(ctx, notifier.Config{Common: common("notifier")}, log.Named("notifier"))
		},
	})
	testkit.Ready(t, nil, sys.gatewayURL, 60*time.Second)
	return sys
}

// postPR sends the pull request fixture with number pr, signed as Gitea
// signs it, and returns the id of the one job the gateway names. A 503
// (neither published nor spooled) is tried again: it promises nothing.
func (s *orchSystem) postPR(t *testing.T, pr int) string {
	t.Helper()
	body := testkit.EditJSON(t, testkit.ReadFile(t, "testdata/pull_request__opened.json"), func(m map[string]any) {
		m["number"] = pr
		m["pull_request"].(map[string]any)["number"] = pr
	})
	h := testkit.GiteaHeaders(clusterGiteaSecret, "pull_request", body)
	h["X-Gitea-Delivery"] = fmt.Sprintf("delivery-%d", pr)

	var id string
	natstest.CheckFor(t, 60*time.Second, 250*time.Millisecond, func() error {
		code, answer, err := testkit.Post(t.Context(), nil, s.gatewayURL+"/webhooks/gitea", h, body)
		if err != nil {
			return err
		}
		if code == http.StatusServiceUnavailable {
			return fmt.Errorf("PR %d: 503 %s", pr, answer)
		}
		if code != http.StatusAccepted {
			t.Fatalf("PR %d: webhook answered %d %s, want 202", pr, code, answer)
		}
		var ans struct {
			Jobs []struct{ ID string } `json:"jobs"`
		}
		if err := json.Unmarshal(answer, &ans); err != nil || len(ans.Jobs) != 1 {
			t.Fatalf("PR %d: answer %s: want one job", pr, answer)
		}
		id = ans.Jobs[0].ID
		return nil
	})
	return id
}

// runs counts the agent's runs of job id.
func (s *orchSystem) runs(t *testing.T, id string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.runsDir, id))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// TestClusterFailover runs orch on a three-node JetStream cluster with R3
// streams, shuts down the node that leads JOBS while jobs flow, starts it
// again, and checks that every job ran exactly once and ended done.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	start := time.Now()
	c := natstest.Cluster(t)
	t.Logf("%v: cluster formed", time.Since(start).Round(time.Millisecond))
	sys := startOrch(t, c)
	t.Logf("%v: services ready", time.Since(start).Round(time.Millisecond))
	nc, js := c.Connect(t)
	defer nc.Close()
	ctx := context.Background()

	// ORCH_STREAM_REPLICAS=3 reached every stream and the bucket.
	for _, name := range []string{proto.StreamJobs, proto.StreamAdvisories, proto.StreamDLQ, "KV_" + proto.BucketJobs} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
	}

	var ids []string
	queue := func(from, to int) {
		for pr := from; pr < to; pr++ {
			ids = append(ids, sys.postPR(t, pr))
		}
	}
	queue(100, 106)

	// Shut down the node that leads JOBS while those jobs are running.
	st := status.New(kvBucket(t, js))
	natstest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		for _, id := range ids {
			if rec, _, err := st.Get(ctx, id); err == nil && rec.State == proto.StateRunning {
				return nil
			}
		}
		return errors.New("no job running yet")
	})
	leader := c.StreamLeader(t, js, proto.StreamJobs)
	t.Logf("%v: shutting down %s, leader of %s", time.Since(start).Round(time.Millisecond), leader, proto.StreamJobs)
	down := c.Node(t, leader)
	down.Shutdown()
	natstest.CheckFor(t, 60*time.Second, 250*time.Millisecond, func() error {
		l, err := streamLeaderErr(js, proto.StreamJobs)
		if err != nil {
			return err
		}
		if l == leader {
			return fmt.Errorf("%s still names %s as leader", proto.StreamJobs, l)
		}
		return nil
	})
	t.Logf("%v: new leader elected", time.Since(start).Round(time.Millisecond))
	queue(200, 206)      // while one node of three is down
	waitDone(t, st, ids) // jobs flow on two nodes of three
	t.Logf("%v: %d jobs done with %s down", time.Since(start).Round(time.Millisecond), len(ids), leader)

	if err := down.Start(); err != nil {
		t.Fatalf("restarting %s: %v", leader, err)
	}
	t.Logf("%v: %s restarted", time.Since(start).Round(time.Millisecond), leader)
	queue(300, 306)

	// Every job ends done, none lost.
	waitDone(t, st, ids)
	t.Logf("%v: all %d jobs done", time.Since(start).Round(time.Millisecond), len(ids))

	// The rejoined node catches up: JOBS is empty on every replica
	// (WorkQueue: acked jobs are removed) once the cluster is whole.
	natstest.CheckFor(t, 60*time.Second, 250*time.Millisecond, func() error {
		s, err := js.Stream(ctx, proto.StreamJobs)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%s still holds %d messages", proto.StreamJobs, info.State.Msgs)
		}
		if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("%s replicas: %+v", proto.StreamJobs, info.Cluster)
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				return fmt.Errorf("%s replica %s not current", proto.StreamJobs, r.Name)
			}
		}
		return nil
	})

	// Exactly once: an agent run per job, and nothing ran twice.
	for _, id := range ids {
		if n := sys.runs(t, id); n != 1 {
			t.Errorf("job %s: agent ran %d times, want 1", id, n)
		}
	}
	checkNoJobDeadLettered(t, js, ids)
	if len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(ids) {
		t.Errorf("job ids are not distinct: %v", ids)
	}
	t.Logf("%v: done", time.Since(start).Round(time.Millisecond))
}

func streamLeaderErr(js jetstream.JetStream, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return "", err
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", name)
	}
	return info.Cluster.Leader, nil
}

func kvBucket(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, proto.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// waitDone waits until the status record of every job in ids says done.
func waitDone(t *testing.T, st *status.Store, ids []string) {
	t.Helper()
	natstest.CheckFor(t, 120*time.Second, 250*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var notDone []string
		for _, id := range ids {
			rec, _, err := st.Get(ctx, id)
			if err != nil {
				notDone = append(notDone, id+": "+err.Error())
				continue
			}
			if rec.State != proto.StateDone {
				notDone = append(notDone, id+": "+string(rec.State))
			}
		}
		if len(notDone) > 0 {
			return fmt.Errorf("%d of %d jobs not done: %v", len(notDone), len(ids), notDone)
		}
		return nil
	})
}

// checkNoJobDeadLettered fails if any of ids reached JOBS_DLQ. Entries for
// other ids are only logged: after a node restart nats-server may send
// MSG_TERMINATED advisories ("Unacknowledged message was deleted") for
// messages that were acked and removed, which the notifier dead-letters
// and alerts on although no job failed.
func checkNoJobDeadLettered(t *testing.T, js jetstream.JetStream, ids []string) {
	t.Helper()
	for _, msg := range natstest.Messages(t, js, proto.StreamDLQ) {
		var job struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(msg.Data, &job)
		if slices.Contains(ids, job.ID) {
			t.Errorf("job %s was dead-lettered: %s %s", job.ID, msg.Header, msg.Data)
			continue
		}
		t.Logf("JOBS_DLQ holds an entry that is no job of this test (a spurious terminal-failure advisory): %s %s", msg.Header, msg.Data)
	}
}
