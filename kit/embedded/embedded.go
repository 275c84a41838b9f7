// Package embedded runs a JetStream-enabled nats-server inside the
// process: for `make run` on one machine, and for tests, which need a real
// server on a random port with a temporary store.
package embedded

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options say where the server listens and keeps its store.
type Options struct {
	// Host and Port to listen on; Port -1 picks a free port.
	Host string
	Port int
	// StoreDir is the JetStream store.
	StoreDir string
	// SyncAlways makes the server fsync every write before it acks, so an
	// acked job survives power loss. Without it the file store fsyncs every
	// two minutes.
	SyncAlways bool
	// ServerName, Cluster and Routes form a cluster; empty for one server.
	ServerName  string
	ClusterName string
	ClusterPort int
	Routes      []string
	// Users may connect, each with its permissions (Users);
	// with any, a client without a login is refused. None: anyone may
	// connect and do anything, as tests want.
	Users []*server.User
}

// Server is a running embedded server that can be shut down and started
// again on the same address and store, as a restarted server would be.
type Server struct {
	opts Options
	srv  *server.Server
}

// Start starts a server and waits until it accepts clients.
func Start(o Options) (*Server, error) {
	s := &Server{opts: o}
	if err := s.start(); err != nil {
		return nil, err
	}
	// Keep the chosen port, so a restart comes back where clients look.
	s.opts.Port = s.srv.Addr().(*net.TCPAddr).Port
	return s, nil
}

// FromURL returns Options that listen where a nats:// URL points.
func FromURL(natsURL string) (Options, error) {
	u, err := url.Parse(natsURL)
	if err != nil {
		return Options{}, fmt.Errorf("parsing %q: %w", natsURL, err)
	}
	port := 4222
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			return Options{}, fmt.Errorf("port of %q: %w", natsURL, err)
		}
	}
	return Options{Host: u.Hostname(), Port: port}, nil
}

func (s *Server) start() error {
	o := &server.Options{
		ServerName: s.opts.ServerName,
		Host:       s.opts.Host,
		Port:       s.opts.Port,
		JetStream:  true,
		StoreDir:   s.opts.StoreDir,
		SyncAlways: s.opts.SyncAlways,
		NoSigs:     true,
		NoLog:      true,
		Users:      s.opts.Users,
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if s.opts.ClusterName != "" {
		o.Cluster.Name = s.opts.ClusterName
		o.Cluster.Host = o.Host
		o.Cluster.Port = s.opts.ClusterPort
		o.Routes = server.RoutesFromStr(strings.Join(s.opts.Routes, ","))
	}
	srv, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("nats server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats server on %s:%d not ready after 10s", o.Host, o.Port)
	}
	s.srv = srv
	return nil
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits until it is down.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Restart shuts the server down and starts it again with the same address
// and store.
func (s *Server) Restart() error {
	s.Shutdown()
	return s.start()
}

// Start starts a server that was shut down.
func (s *Server) Start() error { return s.start() }
