package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/stats"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// leastDispatch times the least any dispatcher of these webhooks does
// for a job of a task whose worktree exists, served by orchbench itself
// as the minimal gateway is, and sent the same deliveries at the same
// pace as orch's dispatch rows: serveMinimal's request (the HMAC check, a
// JSON decode, the job published with fsync before its 202), then a pull
// consumer on that stream whose handler creates the task's lock (one
// fsynced KV create, a fresh key) and starts the agent in the task's
// worktree (the raw baseline's) once the create is confirmed. No
// records, no holds, no fair share, no status writes: nothing orch does
// beyond the two durable writes and the start. Confined (c.bwrap set),
// the agent's sandbox is made from the delivery, beside the create, and
// held at its gate (--block-fd) until the create is confirmed, as orch
// makes its own sandboxes ahead. It is the floor under "worktree exists"
// of any dispatcher with a durable queue and a task lock on this
// machine, and, confined, of any that confines its agents so.
func (b *bench) leastDispatch(ctx context.Context, head string, c leastConfinement) (stats.Sample, error) {
	const name = "BENCH_LEAST"
	stream, err := b.rawStream(ctx, name, "bench.least.>")
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.js.DeleteStream(context.WithoutCancel(ctx), name) }()
	locksCfg := proto.Topology{}.TaskLocksBucket()
	locksCfg.Bucket = "bench_least_locks"
	_ = b.js.DeleteKeyValue(ctx, locksCfg.Bucket)
	locks, err := b.js.CreateKeyValue(ctx, locksCfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.js.DeleteKeyValue(context.WithoutCancel(ctx), locksCfg.Bucket) }()
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "least", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	var (
		jobs    sync.WaitGroup
		jobsErr atomic.Pointer[error]
	)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		jobs.Go(func() {
			if err := b.leastJob(ctx, locks, msg, c); err != nil {
				jobsErr.CompareAndSwap(nil, &err)
			}
		})
	})
	if err != nil {
		return nil, err
	}
	// Stopped, no callback runs any more (Closed), and then every job
	// it began has ended.
	stop := sync.OnceFunc(func() {
		cc.Stop()
		<-cc.Closed()
		jobs.Wait()
	})
	defer stop()
	base, stopServer, err := serveMinimal(b.js, "bench.least.widgets.pull_request", nil)
	if err != nil {
		return nil, err
	}
	defer stopServer()

	ds, ns, err := branchDeliveries("dispatch", b.o.dispatchN, head)
	if err != nil {
		return nil, err
	}
	ss, err := b.sendPaced(ctx, base, ds, ns, b.o.dispatchRate, nil)
	if err != nil {
		return nil, err
	}
	starts, err := waitStartsIn(ctx, nil, b.raw.records, ss, func() error {
		if p := jobsErr.Load(); p != nil {
			return *p
		}
		return nil
	})
	stop()
	if err != nil {
		return nil, err
	}
	if p := jobsErr.Load(); p != nil {
		return nil, *p
	}
	var lat stats.Sample
	for _, s := range ss {
		lat = append(lat, starts[s.id].Sub(s.sent))
	}
	return lat, nil
}

// leastConfinement is how the least dispatcher confines its agents:
// not at all (bwrap ""), in bwrap's floor (sandbox.Floor: the namespaces
// of a job's sandbox and the host's root read-only, which hides nothing),
// or, with etc set, in a job's sandbox as the runner makes one with the
// network none (sandbox.Job: the system read-only, etc as /etc, the
// worktree, its git directories and a home of the task's, nothing else
// of the host), which is the least a sandbox that keeps the host's
// credentials out of the agent's reach costs.
type leastConfinement struct {
	bwrap, etc, homes string
}

// command is the agent's argv in dir, confined as c says, with its gate
// on descriptor 3 when confined.
func (c leastConfinement) command(b *bench, task, dir string) ([]string, error) {
	argv := []string{b.raw.agent, b.raw.records}
	switch {
	case c.bwrap == "":
		return argv, nil
	case c.etc == "":
		floor := sandbox.Floor(c.bwrap, dir, []string{b.raw.records}, argv...)
		return append([]string{floor[0], "--block-fd", "3"}, floor[1:]...), nil
	}
	return sandbox.Job{Bwrap: c.bwrap, Network: sandbox.NetNone, Argv: argv, Worktree: dir,
		Home: filepath.Join(c.homes, task), RW: []string{b.raw.records}, PATH: os.Getenv("PATH"), Etc: c.etc, Gate: 3}.Command()
}

// leastJob runs the job msg carries as the least dispatcher does: its
// task's lock created, its agent started (confined as c says, the
// sandbox made while the lock is created), waited for, the lock deleted
// and the job acked.
func (b *bench) leastJob(ctx context.Context, locks jetstream.KeyValue, msg jetstream.Msg, c leastConfinement) error {
	id := msg.Headers().Get(jetstream.MsgIDHeader)
	var ev struct {
		PullRequest struct {
			Head struct {
				Ref string `json:"ref"`
			} `json:"head"`
		} `json:"pull_request"`
	}
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		return fmt.Errorf("job %s: %w", id, err)
	}
	task, ok := strings.CutPrefix(ev.PullRequest.Head.Ref, "agent/")
	if !ok || id == "" {
		return fmt.Errorf("job %q of branch %q: not a bench task's", id, ev.PullRequest.Head.Ref)
	}
	dir := b.raw.worktree(task)
	argv, err := c.command(b, task, dir)
	if err != nil {
		return fmt.Errorf("job %s: %w", id, err)
	}
	var gate *os.File
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ORCH_JOB_ID="+id, "ORCH_ATTEMPT=1")
	if c.bwrap != "" {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		gate = w
		cmd.ExtraFiles = []*os.File{r}
		err = cmd.Start()
		_ = r.Close()
		if err != nil {
			_ = w.Close()
			return err
		}
	}
	_, lockErr := locks.Create(ctx, proto.Token(task), []byte(id))
	switch {
	case gate != nil && lockErr == nil:
		_, lockErr = gate.Write([]byte{1})
		_ = gate.Close()
	case gate != nil:
		_ = cmd.Process.Kill() // before the gate's end, which bwrap would take as its byte
		_ = gate.Close()
	case lockErr == nil:
		lockErr = cmd.Start()
	}
	var waitErr error
	if cmd.Process != nil {
		waitErr = cmd.Wait()
	}
	if lockErr != nil {
		return fmt.Errorf("job %s: %w", id, lockErr)
	}
	if waitErr != nil {
		return fmt.Errorf("job %s: agent: %w", id, waitErr)
	}
	return errors.Join(locks.Delete(ctx, proto.Token(task)), msg.Ack())
}

// leastRows reports orch's dispatch in an existing worktree against the
// least dispatcher's (leastDispatch), unconfined and, where bwrap is
// installed, confined in bwrap's floor and in a job's sandbox, each over
// the same spawn.
func (b *bench) leastRows(ctx context.Context, t *table, head string, orch, spawn stats.Sample) error {
	progress("the least dispatcher, the same %d tasks, unconfined, then confined in bwrap's floor and in a job's sandbox", b.o.dispatchN)
	modes := []leastConfinement{{}}
	if bwrap, err := exec.LookPath("bwrap"); err == nil {
		etc, err := sandbox.NewEtc("/etc", filepath.Join(b.dir, "least-etc"))
		if err != nil {
			return err
		}
		defer etc.Close()
		dir, release := etc.Acquire()
		defer release()
		modes = append(modes, leastConfinement{bwrap: bwrap},
			leastConfinement{bwrap: bwrap, etc: dir, homes: filepath.Join(b.dir, "least-homes")})
	}
	for _, c := range modes {
		least, err := b.leastDispatch(ctx, head, c)
		if err != nil {
			return fmt.Errorf("the least dispatcher: %w", err)
		}
		how := "unconfined"
		switch {
		case c.etc != "":
			how = "a job's sandbox made ahead, network none"
		case c.bwrap != "":
			how = "bwrap's floor made ahead"
		}
		t.add(row{what: "worktree exists, least dispatcher (" + how + "): sent -> agent", orch: stats.Ms(least.P50()),
			base: "spawn " + stats.Ms(spawn.P50()), ratio: deltaMs(least.P50() - spawn.P50()), target: "-", verdict: "-"})
		if c.bwrap != "" {
			t.add(row{what: "worktree exists, orch over the least dispatcher (" + how + ")", orch: stats.Ms(orch.P50()),
				base: "least " + stats.Ms(least.P50()), ratio: deltaMs(orch.P50() - least.P50()), target: "-", verdict: "-"})
		}
	}
	return nil
}
