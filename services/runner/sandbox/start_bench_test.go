package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/orch-dev/orch/services/runner/agent"
)

// BenchmarkStart is one run of a no-op agent through the supervisor (an
// attempt's start and end as the runner pays for them, without JetStream),
// unconfined, confined with the network none, and confined with init's
// forwarder (bound to a socket nobody serves: the agent does not dial).
// On a 2-core test machine: about 5, 20 and 20 ms.
func BenchmarkStart(b *testing.B) {
	exe, _ := os.Executable()
	bwrap, err := Probe(context.Background(), exe)
	if err != nil {
		b.Skip(err)
	}
	root := b.TempDir()
	wt := worktree(b, root)
	for _, mode := range []string{"none", "bwrap", "bwrap+forwarder"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				argv := []string{"true"}
				if mode != "none" {
					j := Job{Bwrap: bwrap, Init: exe, Network: NetNone, Argv: argv, Worktree: wt, Home: filepath.Join(root, "home"), PATH: "/usr/bin:/bin"}
					if mode == "bwrap+forwarder" {
						j.Network, j.Socket = NetAllowlist, filepath.Join(root, "sock")
						_ = os.WriteFile(j.Socket, nil, 0o600)
					}
					argv, err = j.Command()
					if err != nil {
						b.Fatal(err)
					}
				}
				res := agent.Run(context.Background(), agent.Spec{Argv: argv, Dir: wt, Env: []string{"PATH=/usr/bin:/bin"}, LogPath: filepath.Join(root, "log")})
				if res.Err != nil {
					b.Fatal(res.Err)
				}
			}
		})
	}
}
