package runner

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/proto"
)

// watchCancel watches the job's record and stops the job with
// errCancelled when it turns cancelled. The watch starts with the current
// value, so a cancel that came just before is seen too.
func (r *Runner) watchCancel(ctx context.Context, log *zap.Logger, jobID string, stop context.CancelCauseFunc) {
	for ctx.Err() == nil {
		w, err := r.jobsKV.Watch(ctx, jobID)
		if err != nil {
			log.Debug("watching status for cancel", zap.Error(err))
			backoff.Sleep(ctx, time.Second)
			continue
		}
		cancelled := func() bool {
			defer func() { _ = w.Stop() }()
			for {
				select {
				case <-ctx.Done():
					return false
				case e, ok := <-w.Updates():
					if !ok {
						return false
					}
					if e == nil || e.Operation() != jetstream.KeyValuePut {
						continue
					}
					if st, err := proto.DecodeStatus(e.Value()); err == nil && st.State == proto.StateCancelled {
						return true
					}
				}
			}
		}()
		if cancelled {
			log.Info("job cancelled: stopping it")
			stop(errCancelled)
			return
		}
	}
}
