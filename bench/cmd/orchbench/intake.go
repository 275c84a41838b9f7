package main

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/bench/internal/gitea"
	"github.com/orch-dev/orch/bench/internal/stats"
)

func (b *bench) intakeDeliveries() ([]gitea.Delivery, []int, error) {
	ds := make([]gitea.Delivery, b.o.intakeN)
	ns := make([]int, b.o.intakeN)
	for i := range ds {
		var err error
		if ds[i], ns[i], err = delivery(); err != nil {
			return nil, nil, err
		}
	}
	return ds, ns, nil
}

// rawIntake publishes the intake bodies synchronously through js, each
// with a dedupe id, intakeC at once: the least an intake must do.
func (b *bench) rawIntake(ctx context.Context, js jetstream.JetStream) (stats.Sample, float64, error) {
	if _, err := rawStream(ctx, js, "BENCH_INTAKE", "bench.intake.>"); err != nil {
		return nil, 0, err
	}
	return b.timedIntake(func(d gitea.Delivery, n int) error {
		_, err := js.Publish(ctx, "bench.intake.widgets.review", d.Body, jetstream.WithMsgID("intake-"+strconv.Itoa(n)))
		return err
	})
}

// intake posts the intake webhooks to the gateway at base, intakeC at
// once.
func (b *bench) intake(ctx context.Context, base string) (stats.Sample, float64, error) {
	return b.timedIntake(func(d gitea.Delivery, n int) error {
		_, err := b.sendTo(ctx, base, d, n)
		return err
	})
}

// intakeNew is intake with a new pull request in each webhook: no job
// supersedes another, so a webhook costs orch its publish, and, since no
// runner takes the jobs here, the job's queued record a second later
// (queue.Queue.RecordWaiting).
func (b *bench) intakeNew(ctx context.Context, base string) (stats.Sample, float64, error) {
	ds, ns, err := newTaskDeliveries("intake", b.o.intakeN)
	if err != nil {
		return nil, 0, err
	}
	return b.timedSends(ds, ns, func(d gitea.Delivery, n int) error {
		_, err := b.sendTo(ctx, base, d, n)
		return err
	})
}

// timedIntake hands each intake delivery (and its pull request number) to
// send, intakeC at once, and returns how long each send took and the
// deliveries per second over the whole run.
func (b *bench) timedIntake(send func(d gitea.Delivery, n int) error) (stats.Sample, float64, error) {
	ds, ns, err := b.intakeDeliveries()
	if err != nil {
		return nil, 0, err
	}
	return b.timedSends(ds, ns, send)
}

// timedSends is timedIntake of the deliveries ds.
func (b *bench) timedSends(ds []gitea.Delivery, ns []int, send func(d gitea.Delivery, n int) error) (stats.Sample, float64, error) {
	lat := make(stats.Sample, len(ds))
	start := time.Now()
	err := pool(len(ds), b.o.intakeC, func(i int) error {
		t0 := time.Now()
		err := send(ds[i], ns[i])
		lat[i] = time.Since(t0)
		return err
	})
	return lat, float64(len(ds)) / time.Since(start).Seconds(), err
}

// minimalIntake posts the intake webhooks, intakeC at once, to the least
// a webhook gateway can be, served in this process: net/http reads the
// body, checks its HMAC signature, decodes the JSON, publishes it
// synchronously through js with the delivery as its dedupe id and
// answers 202. No trigger, no status record, no log: what verifying and
// answering a webhook over HTTP costs beside one publish, paid on the
// same cores as the senders, without the wake-ups of a gateway that is a
// process of its own (minimalProcIntake).
func (b *bench) minimalIntake(ctx context.Context, js jetstream.JetStream) (stats.Sample, float64, error) {
	const name = "BENCH_MINIMAL"
	subject := "bench." + strings.ToLower(name)
	if _, err := rawStream(ctx, js, name, subject+".>"); err != nil {
		return nil, 0, err
	}
	base, stop, err := serveMinimal(js, subject+".widgets.review", nil)
	if err != nil {
		return nil, 0, err
	}
	defer stop()
	return b.intake(ctx, base)
}

// serveMinimal serves the least any webhook gateway does, on a port of
// its own: net/http, the HMAC check, a JSON decode and one synchronous
// publish of the body to subject with the delivery's id as its dedupe
// id, answered 202 with that id as the job's. answered, when set, is
// called after each answer. stop closes the server.
func serveMinimal(js jetstream.JetStream, subject string, answered func(number int, id string)) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !hmac.Equal([]byte(gitea.Sign(gitea.Secret, body)), []byte(r.Header.Get("X-Gitea-Signature"))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var ev struct {
			Action      string `json:"action"`
			PullRequest struct {
				Number int `json:"number"`
				Head   struct {
					SHA string `json:"sha"`
				} `json:"head"`
			} `json:"pull_request"`
			Repository struct {
				FullName string `json:"full_name"`
			} `json:"repository"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := r.Header.Get("X-Gitea-Delivery")
		if _, err := js.Publish(r.Context(), subject, body, jetstream.WithMsgID(id)); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"jobs":[{"id":%q,"task":"pr-%d"}]}`, id, ev.PullRequest.Number)
		if answered != nil {
			answered(ev.PullRequest.Number, id)
		}
	})}
	go func() { _ = srv.Serve(ln) }() // ends with stop
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
