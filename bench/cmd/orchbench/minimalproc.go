package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/stats"
)

// The minimal gateway in a process of its own.
//
// serveMinimal in orchbench's own process shares it with the JetStream
// server and the senders: a webhook's trip from a sender to the gateway,
// on to the server and back never leaves one process, where the Go
// scheduler hands it from goroutine to goroutine on threads already
// awake. orch's gateway is a process of its own, as every deployed
// gateway is, and each webhook wakes it and is woken by the server's
// answer: two more processes to schedule per webhook, which on a
// paravirtualised VM cost far more than on bare metal. The same minimal
// gateway in a process of its own (orchbench started again with
// minimalEnv set) is the floor under orch's intake that pays what orch's
// pays.

// Environment of a minimal gateway's process: minimalEnv holds the NATS
// URL, minimalSubjectEnv the subject it publishes to, and
// minimalRecordsEnv, when set, the KV bucket where it creates a record
// after each answer (minimalProcIntake's follow).
const (
	minimalEnv        = "ORCHBENCH_MINIMAL_NATS"
	minimalSubjectEnv = "ORCHBENCH_MINIMAL_SUBJECT"
	minimalRecordsEnv = "ORCHBENCH_MINIMAL_RECORDS"
)

// minimalMain is orchbench's main as a minimal gateway's process: it
// serves serveMinimal, prints its base URL on a line of its own, and
// ends, once its writes have, when its standard input does.
func minimalMain() error {
	nc, err := nats.Connect(os.Getenv(minimalEnv))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	var (
		writes   sync.WaitGroup
		writeErr atomic.Pointer[error]
		answered func(number int, id string)
	)
	if bucket := os.Getenv(minimalRecordsEnv); bucket != "" {
		records, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		answered = recordAfter(ctx, records, &writes, &writeErr)
	}
	base, stop, err := serveMinimal(js, os.Getenv(minimalSubjectEnv), answered)
	if err != nil {
		return err
	}
	fmt.Println(base)
	_, _ = io.Copy(io.Discard, os.Stdin)
	stop()
	writes.Wait()
	if p := writeErr.Load(); p != nil {
		return fmt.Errorf("the writes that follow the answer: %w", *p)
	}
	return nil
}

// recordAfter returns serveMinimal's answered for minimalProcIntake's
// follow: a record created in records, in a goroutine of writes, after
// each answer; the first failure is kept in writeErr.
func recordAfter(ctx context.Context, records jetstream.KeyValue, writes *sync.WaitGroup, writeErr *atomic.Pointer[error]) func(number int, id string) {
	record := bytes.Repeat([]byte("x"), 512) // about a status record's size
	return func(number int, id string) {
		writes.Go(func() {
			key := strconv.Itoa(number) + "-" + strings.ReplaceAll(id, "-", "")
			if _, err := records.Create(ctx, key, record); err != nil {
				writeErr.CompareAndSwap(nil, &err)
			}
		})
	}
}

// minimalProcIntake is minimalIntake with the minimal gateway in a
// process of its own.
//
// With follow, each webhook is followed, after its answer, by the write
// that follows orch's when its job supersedes a waiting one (a record
// created in a KV bucket, as queue.Queue.supersede creates the older
// job's; the older job's dedupe key comes minutes later, see
// queue.Dedupe.Keep): every intake webhook is a review of one of 64 pull
// requests, so each one supersedes the previous review of its pull
// request. That is the floor of an intake that records a superseded job
// at once, as orch's does.
func (b *bench) minimalProcIntake(ctx context.Context, js jetstream.JetStream, follow bool) (stats.Sample, float64, error) {
	name := "BENCH_MINIMAL_PROC"
	if follow {
		name += "_FOLLOW"
	}
	subject := "bench." + strings.ToLower(name)
	if _, err := rawStream(ctx, js, name, subject+".>"); err != nil {
		return nil, 0, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), minimalEnv+"="+js.Conn().ConnectedUrl(), minimalSubjectEnv+"="+subject+".widgets.review")
	if follow {
		bucket := name + "_RECORDS"
		if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket}); err != nil {
			return nil, 0, err
		}
		cmd.Env = append(cmd.Env, minimalRecordsEnv+"="+bucket)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	ended := func(err error) error {
		_ = stdin.Close()
		if werr := cmd.Wait(); werr != nil {
			err = errors.Join(err, fmt.Errorf("the minimal gateway's process: %w: %s", werr, stderr.Bytes()))
		}
		return err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return nil, 0, ended(fmt.Errorf("the minimal gateway's address: %w", err))
	}
	lat, rate, err := b.intake(ctx, strings.TrimSpace(line))
	return lat, rate, ended(err)
}
