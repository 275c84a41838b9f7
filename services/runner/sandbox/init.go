package sandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// initEnv marks the runner's executable started as a sandbox's init; its
// value is the initSpec in JSON, or probeValue.
const initEnv = "ORCH_INTERNAL_SANDBOX_INIT"

// supervisorEnv is package agent's mark of its supervisor (agent imports
// nothing of this package's, nor this package of agent's).
const supervisorEnv = "ORCH_INTERNAL_AGENT_SUPERVISOR"

// Probe's exchange with init.
const (
	probeValue  = "probe"
	probeAnswer = "orch-sandbox-ok"
)

// initSpec is what init is to do besides starting the agent.
type initSpec struct {
	// Listen and Socket: forward each connection to Listen (a loopback
	// address) to the unix socket Socket. Empty, no forwarder.
	Listen string `json:"listen,omitempty"`
	Socket string `json:"socket,omitempty"`
	// Limits go on the agent.
	Limits Limits `json:"limits,omitzero"`
}

// Like package agent's supervisor, init and the rlimits step are
// recognised before main runs, by any binary that links this package.
func init() {
	if v, ok := os.LookupEnv(initEnv); ok {
		// Straight to exit(2): init has nothing to flush, and a binary
		// built with the race detector (a test's) would spend a second
		// in os.Exit's hooks on every job.
		syscall.Exit(runInit(v, os.Args[1:]))
	}
	// The supervisor (package agent), started with the agent's
	// environment, passes the rlimits on: the step is the process it
	// starts.
	if _, supervisor := os.LookupEnv(supervisorEnv); supervisor {
		return
	}
	if v, ok := os.LookupEnv(limitsEnv); ok {
		os.Exit(execLimited(v, os.Args[1:]))
	}
}

// runInit is a sandbox's init: it serves the forwarder, runs argv as the
// agent and returns the agent's exit status.
func runInit(v string, argv []string) int {
	if v == probeValue {
		fmt.Println(probeAnswer)
		return 0
	}
	var spec initSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "orch: bad sandbox init invocation %q %q\n", v, argv)
		return 126
	}
	if spec.Listen != "" {
		ln, err := net.Listen("tcp", spec.Listen)
		if err != nil {
			fmt.Fprintf(os.Stderr, "orch: sandbox forwarder: %v\n", err)
			return 126
		}
		// It serves until init exits, with the agent.
		go forward(ln, spec.Socket)
	}
	// The supervisor's SIGTERM reaches the agent's whole group, this
	// process too: it is the agent that decides how to stop, and init
	// ends when it does. Caught, not ignored: an ignored signal would
	// stay ignored in the agent.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, initEnv+"=") {
			env = append(env, kv)
		}
	}
	cmd := spec.Limits.command(argv, env)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "orch: starting agent: %v\n", err)
		return 127
	}
	_ = cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		// bwrap reports a signalled child as 128+signal, which the
		// runner reads back (agent.Result).
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// forward copies each connection accepted on ln to a new connection to
// the unix socket, both ways, until either side closes.
func forward(ln net.Listener, socket string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("unix", socket)
			if err != nil {
				return
			}
			defer u.Close()
			var wg sync.WaitGroup
			wg.Go(func() {
				_, _ = io.Copy(u, c)
				_ = u.(*net.UnixConn).CloseWrite()
			})
			_, _ = io.Copy(c, u)
			_ = c.(*net.TCPConn).CloseWrite()
			wg.Wait()
		}()
	}
}
