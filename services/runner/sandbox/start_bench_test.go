package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/runner/agent"
)

// BenchmarkStart is one run of a no-op agent through the supervisor (an
// attempt's start and end as the runner pays for them, without JetStream),
// unconfined, in bwrap's floor (Floor: the least bwrap that confines,
// which no sandbox made for each job can go under), confined with the network
// none, and confined with init's forwarder (bound to a socket nobody
// serves: the agent does not dial), init being the runner's executable
// (here the test binary, as big: "bwrap+forwarder") or orch-sandbox-init
// ("bwrap+forwarder+own-init", as `make build` installs the runner).
// On a 2-core test machine: about 6, 15 and 20 ms. Besides the time, it
// reports the CPU time of the processes started (cpu-ms/op, user and
// system, from getrusage of the reaped children), which a loaded shared
// machine disturbs far less than the wall clock.
//
// The "pool:" cases run through a supervisor started ahead and kept
// between runs, as the runner does (agent.Pool), under the allowlist:
// with orch-sandbox-init forwarding inside each job's sandbox
// ("pool:bwrap+forwarder+own-init"), and with the supervisor forwarding
// from a network namespace of its own that the sandbox shares
// ("pool:bwrap+forwarded", agent.Forwarding), and the same with the
// sandbox's /etc one bound copy, as the runner starts them
// ("pool:bwrap+forwarded+etc", Etc). Their supervisor is not
// reaped between runs, so they report the wall clock only.
func BenchmarkStart(b *testing.B) {
	exe, _ := os.Executable()
	bwrap, err := Probe(context.Background(), exe)
	if err != nil {
		b.Skip(err)
	}
	root := b.TempDir()
	wt := worktree(b, root)
	own := testkit.Build(b, b.TempDir(), initPkg)
	for _, mode := range []string{"none", "bwrap-floor", "bwrap", "bwrap+forwarder", "bwrap+forwarder+own-init", "pool:bwrap+forwarder+own-init", "pool:bwrap+forwarded", "pool:bwrap+forwarded+etc"} {
		b.Run(mode, func(b *testing.B) {
			var pool *agent.Pool
			forwarded := strings.HasPrefix(mode, "pool:bwrap+forwarded")
			var etc string
			if strings.HasSuffix(mode, "+etc") {
				e, err := NewEtc("/etc", filepath.Join(b.TempDir(), "etc"))
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				dir, release := e.Acquire()
				defer release()
				etc = dir
			}
			if strings.HasPrefix(mode, "pool:") {
				var fwd *agent.Forwarding
				if forwarded {
					fwd = &agent.Forwarding{Wrap: NetnsCommand(bwrap), Port: ForwardPort}
				}
				pool = agent.NewPool(1, 1, fwd)
				defer pool.Close()
			}
			before := childCPU()
			for b.Loop() {
				argv := []string{"true"}
				switch mode {
				case "none":
				case "bwrap-floor":
					argv = Floor(bwrap, wt, nil, argv...)
				default:
					j := Job{Bwrap: bwrap, Init: exe, Network: NetNone, Argv: argv, Worktree: wt, Home: filepath.Join(root, "home"), PATH: "/usr/bin:/bin"}
					if strings.Contains(mode, "bwrap+forward") {
						j.Network, j.Socket = NetAllowlist, filepath.Join(root, "sock")
						_ = os.WriteFile(j.Socket, nil, 0o600)
					}
					if strings.HasSuffix(mode, "+own-init") {
						j.Init = own
					}
					j.Forwarded, j.Etc = forwarded, etc
					argv, err = j.Command()
					if err != nil {
						b.Fatal(err)
					}
				}
				s := agent.Spec{Argv: argv, Dir: wt, Env: []string{"PATH=/usr/bin:/bin"}, LogPath: filepath.Join(root, "log")}
				if forwarded {
					s.Forward = filepath.Join(root, "sock")
				}
				if res := pool.Run(context.Background(), s); res.Err != nil {
					b.Fatal(res.Err)
				}
			}
			if pool == nil {
				b.ReportMetric(float64(childCPU()-before)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
			}
		})
	}
}

// childCPU is the user and system time of this process's reaped
// children, and theirs.
func childCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
