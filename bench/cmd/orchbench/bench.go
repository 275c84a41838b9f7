package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/freeport"
	"github.com/orch-dev/orch/proto"
)

// bench is one run: the server, a client connection for the baselines and
// the load driver, the built binaries and the running services.
type bench struct {
	o   options
	dir string
	// server is the JetStream server the services and the baselines use,
	// fsyncing every write.
	*server
	bins     map[string]string
	agent    string // the no-op agent binary
	registry string
	records  string // where the agent appends its start lines
	procs    map[string]*proc.Proc
	gateway  string // base URL
	client   *http.Client
	raw      *rawGit // the raw baseline of dispatch and drain
	// peaks is each service's peak RSS (VmHWM) over the processes of it
	// that were stopped: the loaded rows take the greatest, whichever
	// restart came between.
	peaks map[string]int64
}

func setup(ctx context.Context, dir string, o options) (*bench, error) {
	b := &bench{o: o, dir: dir, procs: map[string]*proc.Proc{}, peaks: map[string]int64{}}
	fmt.Fprintln(os.Stderr, "orchbench: building the services")
	binDir := filepath.Join(dir, "bin")
	var err error
	if b.bins, err = proc.Build(ctx, binDir); err != nil {
		return nil, err
	}
	if b.agent, err = proc.BuildPackage(ctx, binDir, "github.com/orch-dev/orch/bench/cmd/benchagent"); err != nil {
		return nil, err
	}
	if b.registry, err = project.Setup(dir); err != nil {
		return nil, err
	}
	// The fairness rows spread jobs over the bench project and these.
	for _, key := range fairProjects[1:] {
		if err := project.Add(b.registry, key, "acme/"+key, ""); err != nil {
			return nil, err
		}
	}
	b.records = filepath.Join(dir, "agent-starts.log")
	// It exists before the runner starts: a sandbox binds it.
	if err := os.WriteFile(b.records, nil, 0o644); err != nil {
		return nil, err
	}
	if b.raw, err = newRawGit(ctx, dir, filepath.Join(dir, "repo"), b.agent); err != nil {
		return nil, err
	}
	if b.server, err = startServer(ctx, filepath.Join(dir, "jetstream"), true); err != nil {
		return nil, err
	}
	// Enough idle connections that the intake senders never redial.
	b.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256}, Timeout: 30 * time.Second}
	return b, nil
}

func (b *bench) close() {
	for name, p := range b.procs {
		if err := p.Stop(15 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "orchbench: %s: %v\n", name, err)
		}
	}
	if b.server != nil {
		b.server.close()
	}
}

// common is the environment every service gets.
func (b *bench) common(name string) []string {
	return proc.ServiceEnv(b.srv.URL(), b.dir, b.registry, name)
}

// start runs one service binary with extra environment.
func (b *bench) start(name string, env ...string) (*proc.Proc, error) {
	return b.startBin(name, b.bins[name], env...)
}

// startBin runs bin as the process name with extra environment, which
// wins over the common environment.
func (b *bench) startBin(name, bin string, env ...string) (*proc.Proc, error) {
	p, err := proc.Start(name, bin, append(b.common(name), env...), filepath.Join(b.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	b.procs[name] = p
	return p, nil
}

// stop stops one service with SIGTERM.
func (b *bench) stop(name string) error {
	p, ok := b.procs[name]
	if !ok {
		return nil
	}
	delete(b.procs, name)
	if m, err := p.Memory(); err == nil {
		b.peaks[name] = max(b.peaks[name], m.HWM)
	}
	return p.Stop(15 * time.Second)
}

func (b *bench) startGateway(ctx context.Context) error {
	var err error
	b.gateway, err = b.startGatewayAs(ctx, "gateway")
	return err
}

// startGatewayAs starts a gateway process named name (its log and data
// dir are named after it) and returns its base URL once it is ready.
// Extra environment (another ORCH_NATS_URL) overrides the common one.
func (b *bench) startGatewayAs(ctx context.Context, name string, env ...string) (string, error) {
	ports, err := freeport.Loopback(1)
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	env = append([]string{"ORCH_HTTP_ADDR=" + addr, "ORCH_GITEA_SECRET=fixture-secret", "ORCH_PLANE_SECRET=plane-secret", "ORCH_API_TOKEN=" + apiToken}, env...)
	p, err := b.startBin(name, b.bins["gateway"], env...)
	if err != nil {
		return "", err
	}
	base := "http://" + addr
	return base, waitFor(ctx, p, 30*time.Second, func() error {
		resp, err := b.client.Get(base + "/readyz")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
}

func (b *bench) startRunner(ctx context.Context) error { return b.startRunnerWith(ctx) }

// startRunnerWith starts the runner with more settings (ORCH_X=value).
// A confined agent (auto picks bubblewrap where it works) may append to
// the records file, and only to it.
func (b *bench) startRunnerWith(ctx context.Context, env ...string) error {
	p, err := b.start("runner", append([]string{
		"ORCH_MAX_CONCURRENCY=" + strconv.Itoa(b.o.concurrency),
		"ORCH_AGENT_COMMAND=" + b.agent + " " + b.records,
		"ORCH_AGENT_SANDBOX_RW=" + b.records,
		"ORCH_RETRY_DELAY=100ms", "ORCH_ACK_WAIT=5s", "ORCH_RUNNER_NAME=bench"}, env...)...)
	if err != nil {
		return err
	}
	return b.waitConsumer(ctx, p, proto.StreamJobs, proto.ConsumerRunner)
}

func (b *bench) startNotifier(ctx context.Context) error {
	p, err := b.start("notifier")
	if err != nil {
		return err
	}
	return b.waitConsumer(ctx, p, proto.StreamAdvisories, proto.ConsumerNotifier)
}

// waitConsumer waits until a service pulls from its consumer.
func (b *bench) waitConsumer(ctx context.Context, p *proc.Proc, stream, consumer string) error {
	return waitFor(ctx, p, 30*time.Second, func() error {
		c, err := b.js.Consumer(ctx, stream, consumer)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumWaiting == 0 {
			return errors.New("no pull request waiting")
		}
		return nil
	})
}

// fatal wraps an error that ends waitFor at once.
type fatal struct{ error }

func (f fatal) Unwrap() error { return f.error }

// waitFor polls f until it returns nil or a fatal error, p exits, or
// timeout passes.
func waitFor(ctx context.Context, p *proc.Proc, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		var fe fatal
		if errors.As(err, &fe) {
			return fe.error
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited:\n%s", p.Name, p.Tail(20))
		}
		if time.Now().After(deadline) {
			if p != nil {
				return fmt.Errorf("%s not ready after %v: %w\n%s", p.Name, timeout, err, p.Tail(20))
			}
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stall is how long a drain may go without a job done before the run
// gives up on it: a loaded machine (make test beside the bench) slows a
// drain, which is the figure; only a drain that stopped ends the run.
const stall = 5 * time.Minute

// waitDrained polls left until it reports nothing left, p exits, or
// nothing has gone for stall.
func waitDrained(ctx context.Context, p *proc.Proc, left func() (int64, error)) error {
	least, since := int64(-1), time.Now()
	return waitFor(ctx, p, 24*time.Hour, func() error {
		n, err := left()
		if err == nil {
			if n == 0 {
				return nil
			}
			if least < 0 || n < least {
				least, since = n, time.Now()
			}
			err = fmt.Errorf("%d left", n)
		}
		if time.Since(since) > stall {
			return fatal{fmt.Errorf("nothing done for %v: %w", stall, err)}
		}
		return err
	})
}

// apiToken is the gateway's ORCH_API_TOKEN in the bench: GET /queue needs it.
const apiToken = "bench-token-of-the-orch-benchmarks-0"

// queueAnswer is the part of GET /queue the bench reads.
type queueAnswer struct {
	Counts map[string]int `json:"counts"`
}

func (b *bench) getQueue(ctx context.Context) (queueAnswer, time.Duration, error) {
	var q queueAnswer
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.gateway+"/queue", nil)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return q, 0, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&q)
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		return q, took, fmt.Errorf("GET /queue: %d", resp.StatusCode)
	}
	return q, took, err
}

// rawStream creates (afresh) a stream shaped like JOBS on other subjects,
// for the baselines: same storage, retention and dedupe window.
func (b *bench) rawStream(ctx context.Context, name, subject string) (jetstream.Stream, error) {
	return rawStream(ctx, b.js, name, subject)
}

func rawStream(ctx context.Context, js jetstream.JetStream, name, subject string) (jetstream.Stream, error) {
	_ = js.DeleteStream(ctx, name)
	cfg := proto.Topology{}.JobsStream()
	cfg.Name, cfg.Subjects, cfg.Description = name, []string{subject}, "orchbench baseline"
	return js.CreateStream(ctx, cfg)
}

// server is an embedded JetStream server with a client connection and
// orch's topology.
type server struct {
	srv *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

// startServer starts an embedded server storing under dir, fsyncing
// every write when syncAlways, else on the server's default schedule.
func startServer(ctx context.Context, dir string, syncAlways bool) (*server, error) {
	srv, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir, SyncAlways: syncAlways})
	if err != nil {
		return nil, err
	}
	s := &server{srv: srv}
	if s.nc, err = nats.Connect(srv.URL(), nats.MaxReconnects(-1)); err != nil {
		s.close()
		return nil, err
	}
	s.js, _ = jetstream.New(s.nc, jetstream.WithPublishAsyncMaxPending(4096))
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := (proto.Topology{}).Ensure(tctx, s.js); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *server) close() {
	if s.nc != nil {
		s.nc.Close()
	}
	s.srv.Shutdown()
}
