package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/project"
	"github.com/orch-dev/orch/proto"
)

// jobMsg is a valid job of the bench project for task, on its subject
// with its dedupe id, and its queued status record.
func jobMsg(id, task string) (*nats.Msg, []byte, error) { return projectJobMsg(project.Key, id, task) }

// projectJobMsg is jobMsg for a job of project key.
func projectJobMsg(key, id, task string) (*nats.Msg, []byte, error) {
	job := proto.Job{
		Schema: proto.SchemaVersion, ID: id, Kind: proto.KindReview, Project: key,
		Task:      proto.Task{ID: task, Title: "bench job " + id},
		Source:    proto.Source{System: "api", Actor: "orchbench"},
		CreatedAt: time.Now().UTC(),
	}
	data, err := json.Marshal(job)
	if err != nil {
		return nil, nil, err
	}
	m := nats.NewMsg(proto.JobSubject(job.Project, job.Kind))
	m.Data = data
	m.Header.Set(proto.HeaderMsgID, id)
	st, err := json.Marshal(proto.Status{Schema: proto.SchemaVersion, Job: job, State: proto.StateQueued, UpdatedAt: job.CreatedAt})
	return m, st, err
}

// publishAll publishes msgs asynchronously and waits for every ack.
func (b *bench) publishAll(ctx context.Context, msgs []*nats.Msg) error {
	var futures []jetstream.PubAckFuture
	for _, m := range msgs {
		f, err := b.js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Minute):
		return errors.New("async publish not acked after 5m")
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			return err
		default:
		}
	}
	return nil
}

// rawDrainConsumer fills a stream of its own, name, on subjects
// prefix.>, with drainN jobs, the ith with the id and task job names, and
// returns a consumer of it, durable, shaped as the runner's with ackWait.
func (b *bench) rawDrainConsumer(ctx context.Context, name, prefix, durable string, ackWait time.Duration, job func(i int) (id, task string)) (jetstream.Consumer, error) {
	st, err := b.rawStream(ctx, name, prefix+".>")
	if err != nil {
		return nil, err
	}
	msgs := make([]*nats.Msg, b.o.drainN)
	for i := range msgs {
		m, _, err := jobMsg(job(i))
		if err != nil {
			return nil, err
		}
		m.Subject = prefix + ".x"
		msgs[i] = m
	}
	if err := b.publishAll(ctx, msgs); err != nil {
		return nil, err
	}
	cfg := proto.RunnerConsumer(b.o.concurrency, 3, ackWait)
	cfg.Durable, cfg.FilterSubject = durable, ""
	return st.CreateOrUpdateConsumer(ctx, cfg)
}

func (b *bench) rawDrain(ctx context.Context) (float64, error) {
	cons, err := b.rawDrainConsumer(ctx, "BENCH_DRAIN", "bench.drain", "raw", 5*time.Second, func(i int) (string, string) {
		return "drain-raw-" + strconv.Itoa(i), "t-" + strconv.Itoa(i%tasks)
	})
	if err != nil {
		return 0, err
	}
	// Each worker acks its message and waits for the server to confirm.
	return b.drainTimed(ctx, cons, func(m jetstream.Msg) error { return m.DoubleAck(ctx) })
}

// rawWorkDrain does the least work of draining drainN new-task jobs by
// hand: concurrency workers each pull a job, add its task's worktree,
// run the agent in it (in bwrap's floor when raw.bwrap is set) and ack
// the job with the server's confirmation. It is timed from the first
// delivery to the last ack. name keeps its stream, consumer and tasks
// apart from another run's.
func (b *bench) rawWorkDrain(ctx context.Context, raw *rawGit, name string) (float64, error) {
	cons, err := b.rawDrainConsumer(ctx, "BENCH_"+strings.ToUpper(name), "bench."+name, name, 30*time.Second, func(i int) (string, string) {
		return name + "-" + strconv.Itoa(i), name + "-" + strconv.Itoa(i)
	})
	if err != nil {
		return 0, err
	}
	return b.drainTimed(ctx, cons, func(m jetstream.Msg) error {
		var job proto.Job
		if err := json.Unmarshal(m.Data(), &job); err != nil {
			return err
		}
		if err := raw.addWorktree(ctx, job.Task.ID); err != nil {
			return err
		}
		if err := raw.spawn(ctx, job.Task.ID, job.ID); err != nil {
			return err
		}
		return m.DoubleAck(ctx)
	})
}

// drainTimed consumes drainN messages from cons in the runner's shape: a
// serial handler that hands each message to one of concurrency workers,
// which runs work on it. It returns messages per second from the first
// delivery to the last work done; the first error of work ends it.
func (b *bench) drainTimed(ctx context.Context, cons jetstream.Consumer, work func(jetstream.Msg) error) (float64, error) {
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		slots = make(chan struct{}, b.o.concurrency)
		first sync.Once
		start time.Time
		werr  atomic.Pointer[error]
	)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		first.Do(func() { start = time.Now() })
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := work(m); err != nil {
				werr.CompareAndSwap(nil, &err)
				return
			}
			done.Add(1)
		})
	}, jetstream.PullMaxMessages(b.o.concurrency))
	if err != nil {
		return 0, err
	}
	var took time.Duration
	err = waitDrained(ctx, nil, func() (int64, error) {
		if p := werr.Load(); p != nil {
			return 0, fatal{*p}
		}
		left := int64(b.o.drainN) - done.Load()
		if left == 0 {
			took = time.Since(start)
		}
		return left, nil
	})
	cc.Stop()
	<-cc.Closed()
	wg.Wait()
	return float64(b.o.drainN) / took.Seconds(), err
}

// drain drains drainN new-task no-op jobs through the runner.
func (b *bench) drain(ctx context.Context) (float64, error) {
	return b.drainOver(ctx, "drain-", project.Key)
}

// drainOver is drain with the jobs (ids prefix<n>) spread over projects
// in turn.
func (b *bench) drainOver(ctx context.Context, prefix string, projects ...string) (float64, error) {
	// Pause the runner's consumer while the jobs are published, so that
	// the clock starts with a full queue, as the baseline's does.
	if _, err := b.js.PauseConsumer(ctx, proto.StreamJobs, proto.ConsumerRunner, time.Now().Add(time.Hour)); err != nil {
		return 0, fmt.Errorf("pausing the runner consumer: %w", err)
	}
	msgs := make([]*nats.Msg, b.o.drainN)
	for i := range msgs {
		m, _, err := projectJobMsg(projects[i%len(projects)], prefix+strconv.Itoa(i), prefix+strconv.Itoa(i))
		if err != nil {
			return 0, err
		}
		msgs[i] = m
	}
	if err := b.publishAll(ctx, msgs); err != nil {
		return 0, err
	}
	stream, err := b.js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		return 0, err
	}
	if _, err := b.js.ResumeConsumer(ctx, proto.StreamJobs, proto.ConsumerRunner); err != nil {
		return 0, err
	}
	// The clock runs from the first agent start to the last ack (the
	// stream is a work queue: an acked job leaves it), as the baseline's
	// runs from its first delivery: a paused pull consumer resumes when
	// the client next pulls, which is no part of either.
	var end time.Time
	err = waitDrained(ctx, b.procs["runner"], func() (int64, error) {
		info, err := stream.Info(ctx)
		if err != nil {
			return 0, err
		}
		if info.State.Msgs == 0 {
			end = time.Now()
		}
		return int64(info.State.Msgs), nil
	})
	if err != nil {
		return 0, err
	}
	starts, err := readStarts(b.records)
	if err != nil {
		return 0, err
	}
	var start time.Time
	for i := range b.o.drainN {
		t, ok := starts[prefix+strconv.Itoa(i)]
		if !ok {
			return 0, fmt.Errorf("job %s%d done without an agent start", prefix, i)
		}
		if start.IsZero() || t.Before(start) {
			start = t
		}
	}
	return float64(b.o.drainN) / end.Sub(start).Seconds(), nil
}
