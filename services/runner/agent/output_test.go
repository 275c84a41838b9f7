package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/services/runner/agent"
)

// With an Output, the runner drains the agent's stdout and stderr: the log
// file and the Output get the same bytes in the agent's order, a line
// longer than any read and invalid UTF-8 included, and the runner's own
// note of why the agent stopped comes after the agent's last byte.
func TestOutputReachesFileAndWriter(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 300_000)
	argv := script(t, dir, fmt.Sprintf(`printf 'out 1\n'
printf 'err 2\n' >&2
head -c 300000 /dev/zero | tr '\0' x
printf '\n\377 end\n'
touch %s/printed
exec sleep 300
`, dir))
	var out bytes.Buffer
	s := spec(t, argv)
	s.Output = &out
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	cause := errors.New("released by the test")
	// Stop the agent once it has printed everything, so its output is
	// whole before the note. The goroutine cannot fail the test itself:
	// it cancels with another cause when the agent never prints.
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join(dir, "printed")); err == nil {
				cancel(cause)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel(errors.New("the agent never printed all"))
	})
	res := agent.Run(ctx, s)
	if !errors.Is(res.Err, cause) {
		t.Fatalf("got %+v, want the test's cause", res)
	}
	want := "out 1\nerr 2\n" + long + "\n\xff end\n" + "\norch: agent stopped: released by the test\n"
	if got := out.String(); got != want {
		t.Errorf("output: %d bytes, want %d; starts %q, ends %q", len(got), len(want), got[:min(len(got), 20)], got[max(0, len(got)-60):])
	}
	if data, _ := os.ReadFile(s.LogPath); string(data) != want {
		t.Errorf("log file: %d bytes, want the same %d bytes as the output", len(data), len(want))
	}
}
