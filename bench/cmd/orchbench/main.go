// Command orchbench measures orch against the least the same work needs,
// done by hand in the same run on the same embedded JetStream server, and
// prints one table: each row a figure of orch, its baseline, their ratio,
// the target and PASS or MISS. The baselines are raw JetStream (publish,
// pull and ack) and raw git (`git worktree add`, a start of the same
// agent binary). With -big it measures a generated big repository instead.
//
// The services run as their real binaries (built into a temporary
// directory), each its own process, against an embedded JetStream server in
// this process that fsyncs every write (SyncAlways), as `make run` does;
// intake is measured again against a second server at the default sync
// setting. The machine is shared, so only the ratios mean anything.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"
)

func main() {
	if os.Getenv(minimalEnv) != "" {
		if err := minimalMain(); err != nil {
			fmt.Fprintln(os.Stderr, "orchbench, minimal gateway:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.IntVar(&o.intakeN, "intake-n", 2000, "webhooks sent in the intake phase (and raw publishes of the same bytes)")
	flag.IntVar(&o.intakeC, "intake-c", 16, "concurrent senders in the intake phase, both sides")
	flag.IntVar(&o.dispatchN, "dispatch-n", 30, "jobs of the low-rate dispatch phases (new task, worktree exists), both sides")
	flag.IntVar(&o.dispatchRate, "dispatch-rate", 2, "webhooks per second in the low-rate dispatch phases")
	flag.IntVar(&o.rate, "rate", 50, "new-task webhooks per second in the pickup phase")
	flag.DurationVar(&o.rateFor, "rate-for", 5*time.Second, "length of the pickup/dispatch phase")
	flag.IntVar(&o.drainN, "drain-n", 1000, "jobs drained in the drain phase, both sides")
	flag.IntVar(&o.concurrency, "concurrency", 8, "ORCH_MAX_CONCURRENCY of the runner, MaxAckPending of the raw consumer")
	flag.IntVar(&o.queueN, "queue-n", 100_000, "jobs queued for the deep GET /queue measurement")
	flag.IntVar(&o.queueGets, "queue-gets", 500, "GET /queue requests per measurement")
	flag.StringVar(&o.keep, "keep", "", "keep the work directory (logs, store) here instead of a temporary one")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a pprof CPU profile of this process (the JetStream server and the load driver) here")
	flag.StringVar(&o.profileDir, "profile-dir", "", "sample the gateway (intake) and the runner (drain) with perf into this directory")
	flag.StringVar(&o.only, "only", "", "run only this phase: dispatch (the two low-rate dispatch rows), drain (the drain rows), intake (the intake rows), egress (model requests through the egress proxy), fairness (drain over 4 projects vs one), pickup (new tasks at -rate) or taskstate (saving and restoring a task's state), with their baselines")
	flag.BoolVar(&o.big, "big", false, "run only the big-repository bench (make bench-big)")
	flag.IntVar(&o.bigFiles, "big-files", 50_000, "files of the generated repository (-big)")
	flag.IntVar(&o.bigCommits, "big-commits", 10_000, "commits of the generated repository's history (-big)")
	flag.IntVar(&o.bigN, "big-n", 5, "new tasks, then jobs in their existing worktrees, each side (-big)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "orchbench:", err)
		os.Exit(1)
	}
}

type options struct {
	intakeN, intakeC    int
	dispatchN           int
	dispatchRate        int
	rate                int
	rateFor             time.Duration
	drainN, concurrency int
	queueN, queueGets   int
	keep                string
	cpuProfile          string
	profileDir          string
	only                string
	big                 bool
	bigFiles            int
	bigCommits          int
	bigN                int
}

func run(ctx context.Context, o options) error {
	dir := o.keep
	if dir == "" {
		d, err := os.MkdirTemp("", "orchbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(os.Stderr, "orchbench: %d CPUs, %s/%s, work dir %s\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, filepath.Clean(dir))
	b, err := setup(ctx, dir, o)
	if err != nil {
		return err
	}
	defer b.close()
	t := &table{}
	phases := b.all
	switch {
	case o.big:
		phases = b.bigRows
	case o.only == "dispatch":
		phases = alone(b.dispatchRows, b.startGateway, b.startRunner)
	case o.only == "drain":
		phases = alone(b.drainRows, b.startRunner)
	case o.only == "intake":
		phases = b.intakeOnly
	case o.only == "egress":
		phases = b.egressRows
	case o.only == "fairness":
		phases = alone(b.fairnessRows, b.startRunner)
	case o.only == "taskstate":
		phases = b.taskStateRows
	case o.only == "pickup":
		phases = alone(b.pickupRows, b.startGateway, b.startRunner)
	case o.only != "":
		return fmt.Errorf("-only %q: the phases that run alone are dispatch, pickup, drain, intake, egress, fairness and taskstate", o.only)
	}
	if err := phases(ctx, t); err != nil {
		t.print(os.Stdout)
		return err
	}
	t.print(os.Stdout)
	return nil
}

// progress says on stderr what the bench is doing.
func progress(f string, a ...any) { fmt.Fprintf(os.Stderr, "orchbench: "+f+"\n", a...) }
