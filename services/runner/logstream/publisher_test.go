package logstream

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/logread"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/services/runner/agent"
)

// readLog reads one attempt's readable output back from the stream.
func readLog(t *testing.T, ctx context.Context, p *Publisher, cfg Config) string {
	t.Helper()
	var buf bytes.Buffer
	if err := logread.Copy(ctx, cfg.JS, cfg.JobID, cfg.Attempt, &buf, logread.ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestJetStreamRestartWhileAgentPrints(t *testing.T) {
	srv := natstest.Server(t)
	_, js, _ := natstest.Connect(t, srv)
	dir := t.TempDir()
	// Phase 1 is published; during phase 2 JetStream is down, and phase 2
	// is far more than the buffer; phase 3 comes once it is back.
	script := fmt.Sprintf(`
echo "phase1 start"
while [ ! -e %[1]s/go1 ]; do sleep 0.02; done
i=0; while [ $i -lt 5000 ]; do echo "phase2 line $i"; i=$((i+1)); done
echo "phase2 done" > %[1]s/phase2
while [ ! -e %[1]s/go2 ]; do sleep 0.02; done
echo "phase3 end"
`, dir)
	logPath := filepath.Join(dir, "agent.log")
	cfg := Config{JS: js, JobID: "restart", Attempt: 1, Path: logPath, BufferBytes: 16 << 10, PublishTimeout: 500 * time.Millisecond}
	p := mustStart(t, cfg)
	ctx := context.Background()
	done := make(chan agent.Result, 1)
	go func() {
		done <- agent.Run(ctx, agent.Spec{Argv: []string{"sh", "-c", script}, Dir: dir, Env: os.Environ(), LogPath: logPath, Drained: p.Wake, Timeout: time.Minute})
	}()
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := readLog(t, ctx, p, cfg); got != "phase1 start\n" {
			return fmt.Errorf("stream has %q", got)
		}
		return nil
	})

	srv.Shutdown()
	touch(t, filepath.Join(dir, "go1"))
	// The agent prints all of phase 2 with JetStream away: it is not
	// held up by its output.
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		_, err := os.Stat(filepath.Join(dir, "phase2"))
		return err
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// Once JetStream is back, the buffer drains and the log says what
	// was dropped; output after that is kept.
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if got := readLog(t, ctx, p, cfg); !strings.Contains(got, "dropped here") {
			return fmt.Errorf("no drop note yet; %d bytes", len(got))
		}
		return nil
	})
	touch(t, filepath.Join(dir, "go2"))
	res := <-done
	if res.Err != nil {
		t.Fatalf("agent: %v", res.Err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st := p.Close(cctx)
	cancel()
	if !st.Ended || st.DroppedLines == 0 {
		t.Fatalf("stats %+v: want the end published and lines dropped", st)
	}

	// The log: phase 1, the kept start of phase 2 in order, a note of
	// exactly what was dropped, phase 3.
	got := readLog(t, ctx, p, cfg)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if lines[0] != "phase1 start" || lines[len(lines)-1] != "phase3 end" {
		t.Fatalf("log does not begin with phase 1 and end with phase 3:\n%s", got)
	}
	note := regexp.MustCompile(`^orch: (\d+) bytes \((\d+) lines\) of output dropped here`)
	kept, notes := 0, 0
	for _, l := range lines[1 : len(lines)-1] {
		if m := note.FindStringSubmatch(l); m != nil {
			notes++
			n, _ := strconv.Atoi(m[2])
			if int64(n) != st.DroppedLines {
				t.Errorf("note says %d lines dropped, the publisher dropped %d", n, st.DroppedLines)
			}
			continue
		}
		if notes > 0 {
			t.Errorf("phase 2 line %q after the drop note", l)
		}
		if want := fmt.Sprintf("phase2 line %d", kept); l != want {
			t.Fatalf("kept line %d is %q, want %q", kept, l, want)
		}
		kept++
	}
	if notes != 1 || int64(kept)+st.DroppedLines != 5000 {
		t.Errorf("%d notes, %d lines kept + %d dropped, want one note and 5000 lines", notes, kept, st.DroppedLines)
	}
	// The local file keeps everything.
	if b, _ := os.ReadFile(logPath); bytes.Count(b, []byte("\n")) != 5002 {
		t.Errorf("local file has %d lines, want 5002", bytes.Count(b, []byte("\n")))
	}
}

// An agent that prints far faster than JetStream stores loses nothing:
// the log file holds what JetStream has not taken yet.
func TestFastAgentLosesNothing(t *testing.T) {
	js, _ := natstest.JetStream(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "agent.log")
	// Batches of 4 KiB and a buffer of 128 KiB: far less than the
	// agent prints while the first messages are stored.
	cfg := Config{JS: js, JobID: "fast", Attempt: 1, Path: logPath, BatchBytes: 4 << 10, BufferBytes: 128 << 10}
	p := mustStart(t, cfg)
	res := agent.Run(context.Background(), agent.Spec{Argv: []string{"sh", "-c", `seq 1 200000`}, Dir: dir, Env: os.Environ(), LogPath: logPath, Drained: p.Wake, Timeout: time.Minute})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := p.Close(ctx)
	if !st.Ended || st.DroppedBytes != 0 {
		t.Fatalf("stats %+v: want all published", st)
	}
	var want strings.Builder
	for i := 1; i <= 200000; i++ {
		fmt.Fprintln(&want, i)
	}
	if got := readLog(t, ctx, p, cfg); got != want.String() {
		t.Errorf("stream has %d bytes, want the %d of seq 1 200000", len(got), want.Len())
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The bench agents print as fast as they can: 300,000 short lines with a
// write per line, as an agent streaming its progress line by line does;
// the same lines buffered, as most programs print to a file or pipe; and
// Claude Code's own output, the events of a recorded stream-json run
// (about 1.3 KB a line) over and over, 18,000 lines, a write per line,
// which the runner also renders into the readable log.
const (
	benchAgentLines    = `awk 'BEGIN { for (i = 0; i < 300000; i++) { print "line " i ": the agent reports what it does, as fast as it can print it"; fflush() } }'`
	benchAgentBuffered = `awk 'BEGIN { for (i = 0; i < 300000; i++) { print "line " i ": the agent reports what it does, as fast as it can print it" } }'`
	benchAgentEvents   = `awk '{ l[n++] = $0 } END { for (i = 0; i < 18000; i++) { print l[i %% n]; fflush() } }' '%s'`
)

// BenchmarkAgentOutput runs the same agent with its output to /dev/null,
// writing a plain log file itself, and through orch (the runner drains
// its output pipe into the log file and a Publisher, to JetStream), and
// reports how much longer the agent took through orch: slowdown-%
// (target: at most 10), and over-file-%, against the agent writing a
// plain log file as a runner without JOBS_LOGS had it do. The cpu-
// figures compare the processor time the agent itself used, which the
// load of a shared machine moves far less than the elapsed time.
func BenchmarkAgentOutput(b *testing.B) {
	b.Run("write-per-line", func(b *testing.B) { benchAgentOutput(b, benchAgentLines) })
	b.Run("buffered", func(b *testing.B) { benchAgentOutput(b, benchAgentBuffered) })
	events, err := filepath.Abs("testdata/success.jsonl")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("claude-events", func(b *testing.B) { benchAgentOutput(b, fmt.Sprintf(benchAgentEvents, events)) })
}

// benchTimes add up the agent's elapsed and processor time.
type benchTimes struct{ wall, cpu time.Duration }

func benchAgentOutput(b *testing.B, benchAgent string) {
	srv := natstest.Server(b)
	nc, js, _ := natstest.Connect(b, srv)
	dir := b.TempDir()
	run := func(t *benchTimes, logPath string, drained func()) {
		res := agent.Run(context.Background(), agent.Spec{Argv: []string{"sh", "-c", benchAgent}, Dir: dir, Env: os.Environ(), LogPath: logPath, Drained: drained})
		if res.Err != nil {
			b.Fatal(res.Err)
		}
		t.wall += res.Duration
		t.cpu += res.CPU
	}
	var plain, file, orch benchTimes
	for i := 0; b.Loop(); i++ {
		run(&plain, os.DevNull, nil)
		run(&file, filepath.Join(dir, fmt.Sprintf("file-%d.log", i)), nil)
		path := filepath.Join(dir, fmt.Sprintf("%d.log", i))
		p := mustStart(b, Config{JS: js, JobID: "bench", Attempt: i + 1, Path: path, MaxPayload: nc.MaxPayload(), BufferBytes: 8 << 20})
		run(&orch, path, p.Wake)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if st := p.Close(ctx); !st.Ended || st.DroppedBytes > 0 {
			b.Errorf("output not all published: %+v", st)
		}
		cancel()
	}
	pct := func(a, b time.Duration) float64 { return 100 * (float64(a)/float64(b) - 1) }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(pct(orch.wall, plain.wall), "slowdown-%")
	b.ReportMetric(pct(orch.wall, file.wall), "over-file-%")
	b.ReportMetric(pct(orch.cpu, plain.cpu), "cpu-slowdown-%")
	b.ReportMetric(pct(orch.cpu, file.cpu), "cpu-over-file-%")
	b.ReportMetric(ms(plain.wall), "devnull-ms/run")
	b.ReportMetric(ms(file.wall), "file-ms/run")
	b.ReportMetric(ms(orch.wall), "orch-ms/run")
}

// One batch that mixes plain lines, Claude Code events, a JSON line the
// renderer shows as it is and invalid UTF-8: the readable view renders
// each line in place, the raw view is the agent's bytes, and the
// progress counts the events.
func TestViewsOfAMixedBatch(t *testing.T) {
	js, _ := natstest.JetStream(t)
	events, err := os.ReadFile("testdata/success.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	raw := "plain before\n{\"not\":\"an event\"}\n" + string(events) + "bad \xff byte\nplain after\n"
	r := NewRenderer()
	var want []byte
	for line := range strings.Lines(raw) {
		want = r.Line(want, []byte(strings.TrimSuffix(line, "\n")))
	}
	cfg := Config{JS: js, JobID: "mixed", Attempt: 1, Path: filepath.Join(t.TempDir(), "agent.log"), BufferBytes: 8 << 20}
	if err := os.WriteFile(cfg.Path, []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	p := mustStart(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st := p.Close(ctx); !st.Ended || st.Messages != 3 {
		t.Fatalf("stats %+v: want the end published after one text and one raw message", st)
	}
	if prog, _ := p.Progress(); prog != r.Progress() || prog.Turns == 0 {
		t.Errorf("progress %+v, want %+v", prog, r.Progress())
	}
	for _, view := range []struct {
		raw  bool
		want string
	}{{false, string(want)}, {true, raw}} {
		var buf bytes.Buffer
		if err := logread.Copy(ctx, js, cfg.JobID, cfg.Attempt, &buf, logread.ReadOptions{Raw: view.raw}); err != nil {
			t.Fatal(err)
		}
		if buf.String() != view.want {
			t.Errorf("raw=%v view:\n%s\nwant:\n%s", view.raw, buf.String(), view.want)
		}
	}
}

// mustStart is Start, failing the test on its error.
func mustStart(tb testing.TB, cfg Config) *Publisher {
	tb.Helper()
	p, err := Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// A publisher without a buffer would drop every line: Start refuses it
// rather than choose a size of its own.
func TestStartRefusesNoBuffer(t *testing.T) {
	if p, err := Start(Config{JobID: "none", Attempt: 1, Path: filepath.Join(t.TempDir(), "agent.log")}); err == nil {
		p.Close(context.Background())
		t.Fatal("Start with BufferBytes 0 succeeded")
	}
}
