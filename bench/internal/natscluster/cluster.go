// Package natscluster runs a JetStream cluster of real nats-server
// processes on loopback, for the cluster soak: each server its own
// process (so SIGKILL is a real crash), its own store and configuration
// file, logins from kit/natsauth's table, and every route through a TCP
// proxy of this package, so that one server can be cut off from the
// others (a partition) while its clients still reach it.
//
// Routes. Server i dials server j through a proxy of its own (i to j), and
// every server advertises an address where nothing listens, so no server
// ever dials another straight from what the cluster gossips about it: all
// route traffic goes through the proxies, and Partition cuts exactly the
// links of one server.
package natscluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/bench/internal/proc"
	"github.com/orch-dev/orch/kit/freeport"
	"github.com/orch-dev/orch/kit/natsauth"
)

// Build compiles nats-server (the version this module requires, its main
// package) into dir and returns its path.
func Build(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "nats-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "github.com/nats-io/nats-server/v2")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build nats-server: %w\n%s", err, b)
	}
	return out, nil
}

// Options describe a cluster.
type Options struct {
	// Bin is the nats-server binary (Build).
	Bin string
	// Dir holds each server's configuration, store and log.
	Dir string
	// Size is the number of servers; 3 if zero.
	Size int
	// Passwords of kit/natsauth's users: the servers take the table's
	// users and refuse anonymous clients. Nil: no logins.
	Passwords map[string]string
}

// Cluster is a running cluster.
type Cluster struct {
	opts    Options
	servers []*Server
	// proxies[i][j] carries the routes server i dials to server j.
	proxies [][]*proxy
}

// Server is one member of the cluster.
type Server struct {
	// Name is the server_name, nats-1 and so on: the name JetStream gives
	// a stream's leader and replicas.
	Name       string
	clientPort int
	httpPort   int
	routePort  int
	conf       string
	env        []string

	mu   sync.Mutex
	proc *proc.Proc
}

// URL is the server's client URL.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.clientPort) }

// Running reports whether the server's process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.Exited()
}

// Start starts the cluster's servers and waits until every one is healthy
// (its JetStream ready and current), within ctx.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.Size == 0 {
		o.Size = 3
	}
	c := &Cluster{opts: o}
	ports, err := freeport.Loopback(3 * o.Size) // out of the way of other processes' connections
	if err != nil {
		return nil, err
	}
	for i := range o.Size {
		c.servers = append(c.servers, &Server{
			Name:       fmt.Sprintf("nats-%d", i+1),
			clientPort: ports[3*i], httpPort: ports[3*i+1], routePort: ports[3*i+2],
		})
	}
	c.proxies = make([][]*proxy, o.Size)
	for i := range o.Size {
		c.proxies[i] = make([]*proxy, o.Size)
		for j := range o.Size {
			if i == j {
				continue
			}
			p, err := newProxy("127.0.0.1:" + strconv.Itoa(c.servers[j].routePort))
			if err != nil {
				c.Stop()
				return nil, err
			}
			c.proxies[i][j] = p
		}
	}
	// A port where nothing listens: what every server advertises for its
	// routes (see the package comment).
	nowhere, err := freeport.Loopback(1)
	if err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.writeConfigs(nowhere[0]); err != nil {
		c.Stop()
		return nil, err
	}
	for _, s := range c.servers {
		if err := c.start(s); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) writeConfigs(nowhere int) error {
	users := ""
	var env []string
	if c.opts.Passwords != nil {
		users = "include ./users.conf\n"
		if err := os.WriteFile(filepath.Join(c.opts.Dir, "users.conf"), []byte(natsauth.Config()), 0o600); err != nil {
			return err
		}
		for _, u := range natsauth.Users() {
			pw := c.opts.Passwords[u]
			if pw == "" {
				return fmt.Errorf("no password for NATS user %s", u)
			}
			env = append(env, natsauth.PasswordVar(u)+"="+pw)
		}
	}
	for i, s := range c.servers {
		var routes []string
		for j := range c.servers {
			if j != i {
				routes = append(routes, "    nats-route://"+c.proxies[i][j].addr())
			}
		}
		conf := fmt.Sprintf(`# %[1]s of the cluster soak's cluster (bench/internal/natscluster).
server_name: %[1]s
listen: 127.0.0.1:%[2]d
http: 127.0.0.1:%[3]d
jetstream {
  store_dir: %[4]q
}
cluster {
  name: orch-soak
  listen: 127.0.0.1:%[5]d
  # Nothing listens there: a server dials another only through its proxy.
  advertise: 127.0.0.1:%[6]d
  routes: [
%[7]s
  ]
}
%[8]s`, s.Name, s.clientPort, s.httpPort, filepath.Join(c.opts.Dir, s.Name, "jetstream"), s.routePort, nowhere,
			strings.Join(routes, "\n"), users)
		s.conf = filepath.Join(c.opts.Dir, s.Name+".conf")
		s.env = env
		if err := os.MkdirAll(filepath.Join(c.opts.Dir, s.Name), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) start(s *Server) error {
	p, err := proc.StartArgs(s.Name, c.opts.Bin, []string{"-c", s.conf}, s.env, filepath.Join(c.opts.Dir, s.Name+".log"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// Servers lists the members, nats-1 first.
func (c *Cluster) Servers() []*Server { return c.servers }

// URL is every server's client URL, comma-separated, as ORCH_NATS_URL
// lists a cluster.
func (c *Cluster) URL() string {
	var urls []string
	for _, s := range c.servers {
		urls = append(urls, s.URL())
	}
	return strings.Join(urls, ",")
}

// Server returns the member named name, or nil.
func (c *Cluster) Server(name string) *Server {
	for _, s := range c.servers {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Kill SIGKILLs the server's process and waits until it is reaped.
func (c *Cluster) Kill(s *Server) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Restart starts a killed server again, on its ports and store.
func (c *Cluster) Restart(s *Server) error {
	if s.Running() {
		return fmt.Errorf("%s is running", s.Name)
	}
	return c.start(s)
}

// Partition cuts every route to and from s (cut) or heals them.
func (c *Cluster) Partition(s *Server, cut bool) {
	i := c.index(s)
	for j := range c.servers {
		if j == i {
			continue
		}
		c.proxies[i][j].setCut(cut)
		c.proxies[j][i].setCut(cut)
	}
}

func (c *Cluster) index(s *Server) int {
	for i, m := range c.servers {
		if m == s {
			return i
		}
	}
	panic("natscluster: not a member: " + s.Name)
}

// Healthy asks server s's monitoring endpoint /healthz: nil once its
// JetStream is up and every stream and consumer it holds is current.
func (c *Cluster) Healthy(ctx context.Context, s *Server) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(s.httpPort)+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: /healthz %d %s", s.Name, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// WaitHealthy waits until every server is healthy, polling, within ctx.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for {
		var errs []error
		for _, s := range c.servers {
			if !s.Running() {
				s.mu.Lock()
				tail := ""
				if s.proc != nil {
					tail = s.proc.Tail(10)
				}
				s.mu.Unlock()
				return fmt.Errorf("%s is not running:\n%s", s.Name, tail)
			}
			if err := c.Healthy(ctx, s); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not healthy: %w", errors.Join(errs...))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Stop stops every server (SIGTERM, then SIGKILL after a grace) and the
// proxies.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, s := range c.servers {
		s.mu.Lock()
		p := s.proc
		s.mu.Unlock()
		if p != nil && !p.Exited() {
			wg.Go(func() { _ = p.Stop(10 * time.Second) })
		}
	}
	wg.Wait()
	for _, row := range c.proxies {
		for _, p := range row {
			if p != nil {
				_ = p.close()
			}
		}
	}
}
