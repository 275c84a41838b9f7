package agent_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/orch-dev/orch/services/runner/agent"
)

// BenchmarkStart is one run of a no-op agent (true) from start to end:
// straight through os/exec (the least an agent's start costs), through a
// supervisor started for it (Run), and through the pool's (Pool.Run: one
// started ahead, or the last run's taken back). On a 2-core VM where a
// process start is slow (bash runs /bin/true in 4 ms): about 2.3, 22 and
// 7 ms with supervisors started ahead, before they were taken back.
func BenchmarkStart(b *testing.B) {
	dir := b.TempDir()
	s := agent.Spec{Argv: []string{"true"}, Dir: dir, Env: []string{"PATH=/usr/bin:/bin"}, LogPath: filepath.Join(dir, "log")}
	b.Run("exec", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			if res := agent.Run(context.Background(), s); res.Err != nil {
				b.Fatal(res.Err)
			}
		}
	})
	b.Run("warm", func(b *testing.B) {
		p := agent.NewPool(2, 2, nil)
		defer p.Close()
		for b.Loop() {
			// The pool starts the next supervisor after each take: give
			// it the time that passes between two jobs.
			b.StopTimer()
			time.Sleep(100 * time.Millisecond)
			b.StartTimer()
			if res := p.Run(context.Background(), s); res.Err != nil {
				b.Fatal(res.Err)
			}
		}
	})
}
