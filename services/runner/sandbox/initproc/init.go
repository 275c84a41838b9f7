package initproc

import (
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// runInit is a sandbox's init: it serves the forwarder, runs argv as the
// agent and returns the agent's exit status.
func runInit(v string, argv []string) int {
	if v == ProbeValue {
		_, _ = os.Stdout.WriteString(ProbeAnswer + "\n")
		return 0
	}
	spec, err := ParseSpec(v)
	if err != nil || len(argv) == 0 {
		say("bad sandbox init invocation ", strconv.Quote(v), " ", strconv.Quote(strings.Join(argv, " ")))
		return 126
	}
	if spec.Port != 0 {
		ln, err := Listen(spec.Port)
		if err != nil {
			say("sandbox forwarder on 127.0.0.1:", strconv.Itoa(spec.Port), ": ", err.Error())
			return 126
		}
		// It serves until init exits, with the agent.
		go Forward(ln, func() string { return spec.Socket })
	}
	// The supervisor's SIGTERM reaches the agent's whole group, this
	// process too: it is the agent that decides how to stop, and init
	// ends when it does. Caught, not ignored: an ignored signal would
	// stay ignored in the agent.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, InitEnv+"=") {
			env = append(env, kv)
		}
	}
	argv, limits := spec.Limits.Wrap("/proc/self/exe", argv)
	if limits != "" {
		env = append(env, limits)
	}
	path, err := lookPath(argv[0])
	if err != nil {
		say("starting agent: ", err.Error())
		return 127
	}
	p, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		say("starting agent: ", err.Error())
		return 127
	}
	state, err := p.Wait()
	if err != nil {
		say("waiting for the agent: ", err.Error())
		return 126
	}
	ws, _ := state.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		// bwrap reports a signalled child as 128+signal, which the
		// runner reads back (agent.Result).
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// Listen is a TCP listener on 127.0.0.1:port, made with system calls:
// package net would order this package's initialisation after most of
// the runner's dependencies (see the package's comment).
func Listen(port int) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err == nil {
		err = syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
		if err == nil {
			err = syscall.Listen(fd, syscall.SOMAXCONN)
		}
	}
	if err != nil {
		_ = syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Forward copies each connection accepted on ln to a new connection to
// the unix socket that socket names at the time, both ways, until either
// side closes; a connection accepted while it names none is closed.
func Forward(ln int, socket func() string) {
	for {
		c, _, err := syscall.Accept4(ln, syscall.SOCK_CLOEXEC)
		if err == syscall.EINTR || err == syscall.ECONNABORTED {
			continue
		}
		if err != nil {
			return
		}
		go relay(c, socket())
	}
}

// relay copies between the accepted connection c and a new connection
// to the unix socket, both ways, each side's end passed on as a
// shutdown of writing, then closes both.
func relay(c int, socket string) {
	cf := os.NewFile(uintptr(c), "tcp")
	defer cf.Close()
	if socket == "" {
		return
	}
	u, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	uf := os.NewFile(uintptr(u), "unix")
	defer uf.Close()
	for {
		err = syscall.Connect(u, &syscall.SockaddrUnix{Name: socket})
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(uf, cf)
		_ = syscall.Shutdown(u, syscall.SHUT_WR)
	})
	_, _ = io.Copy(cf, uf)
	_ = syscall.Shutdown(c, syscall.SHUT_WR)
	wg.Wait()
}
