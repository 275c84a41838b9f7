package agent_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orch-dev/orch/services/runner/agent"
)

// With Drained set, the runner drains the agent's stdout and stderr into
// the log file: the agent's bytes in its order, a line longer than any
// read and invalid UTF-8 included, then the runner's own note of why the
// agent stopped; each write to the file is signalled.
func TestDrainedOutputReachesTheLog(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 300_000)
	argv := script(t, dir, fmt.Sprintf(`printf 'out 1\n'
printf 'err 2\n' >&2
head -c 300000 /dev/zero | tr '\0' x
printf '\n\377 end\n'
touch %s/printed
exec sleep 300
`, dir))
	var drained atomic.Int64
	s := spec(t, argv)
	s.Drained = func() { drained.Add(1) }
	cause := errors.New("released by the test")
	// Stop the agent once it has printed everything, so its output is
	// whole before the note.
	ctx := cancelWhenExists(t, filepath.Join(dir, "printed"), cause, "the agent never printed all")
	res := agent.Run(ctx, s)
	if !errors.Is(res.Err, cause) {
		t.Fatalf("got %+v, want the test's cause", res)
	}
	want := "out 1\nerr 2\n" + long + "\n\xff end\n" + "\norch: agent stopped: released by the test\n"
	if data, _ := os.ReadFile(s.LogPath); string(data) != want {
		t.Errorf("log file: %d bytes, want %d; ends %q", len(data), len(want), data[max(0, len(data)-60):])
	}
	if drained.Load() < 2 {
		t.Errorf("Drained called %d times, want once a write at least", drained.Load())
	}
}
