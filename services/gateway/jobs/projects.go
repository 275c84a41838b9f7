package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
)

// ProjectFigures is one project's line of the queue's summary: its jobs
// queued (waiting for a slot), running (retrying ones included) and held,
// its own agent limit (0: only the global one), and its operator's pause
// while there is one.
type ProjectFigures struct {
	Key            string       `json:"key"`
	Queued         int          `json:"queued"`
	Running        int          `json:"running"`
	Held           int          `json:"held"`
	MaxConcurrency int          `json:"max_concurrency,omitempty"`
	Paused         *proto.Pause `json:"paused,omitempty"`
}

// ProjectChange is the answer of a pause or a resume.
type ProjectChange struct {
	Project string       `json:"project"`
	Paused  bool         `json:"paused"`
	Pause   *proto.Pause `json:"pause,omitempty"`
}

// ProjectFigures returns the figures of every project of the registry, in its
// order. The counts come from the index; the pauses from BucketPauses,
// left out while NATS is away.
func (s *Service) ProjectFigures(ctx context.Context) []ProjectFigures {
	counts := s.cfg.Index.ProjectCounts()
	pauses := s.pauses(ctx)
	var out []ProjectFigures
	for _, p := range s.cfg.Registry().Projects() {
		c := counts[p.Key]
		out = append(out, ProjectFigures{
			Key: p.Key, Queued: c[proto.StateQueued], Running: c[proto.StateRunning] + c[proto.StateRetrying],
			Held: c[proto.StateHeld], MaxConcurrency: p.MaxConcurrency, Paused: pauses[p.Key],
		})
	}
	return out
}

// pauses reads the operators' project pauses, by project key; none when
// NATS or the bucket is away (the figures are best effort).
func (s *Service) pauses(ctx context.Context) map[string]*proto.Pause {
	out := map[string]*proto.Pause{}
	kv, err := s.pausesBucket(ctx)
	if err != nil {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	w, err := kv.WatchFiltered(ctx, []string{proto.PauseProjectPrefix + ">"}, jetstream.IgnoreDeletes())
	if err != nil {
		return out
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out // the snapshot is complete
			}
			if pz, err := proto.DecodePause(e.Value()); err == nil {
				out[strings.TrimPrefix(e.Key(), proto.PauseProjectPrefix)] = pz
			}
		case <-ctx.Done():
			return out
		}
	}
}

func (s *Service) pausesBucket(ctx context.Context) (jetstream.KeyValue, error) {
	c := s.conn.Load()
	if c == nil {
		return nil, refuse(http.StatusServiceUnavailable, "pauses unavailable: not connected to NATS yet")
	}
	kv, err := c.js.KeyValue(ctx, proto.BucketPauses)
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "opening bucket %s: %v", proto.BucketPauses, err)
	}
	return kv, nil
}

// Pause pauses the project key for by (who asked; note is their words):
// its queued jobs are held (reason operator) as runners reach them and
// run after Resume; running ones finish. The pause is a key of
// BucketPauses, so it outlives every service's restart. Pausing a paused
// project keeps its first pause.
func (s *Service) Pause(ctx context.Context, key, by, note string) (ProjectChange, error) {
	if _, ok := s.cfg.Registry().ByKey(key); !ok {
		return ProjectChange{}, refuse(http.StatusNotFound, "no such project")
	}
	kv, err := s.pausesBucket(ctx)
	if err != nil {
		return ProjectChange{}, err
	}
	pz := &proto.Pause{Schema: proto.SchemaVersion, Reason: proto.HoldOperator, Since: s.cfg.Now().UTC(), By: by, Note: note}
	data, err := json.Marshal(pz)
	if err != nil {
		return ProjectChange{}, fmt.Errorf("encoding pause: %w", err)
	}
	_, err = kv.Create(ctx, proto.ProjectPauseKey(key), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := kv.Get(ctx, proto.ProjectPauseKey(key))
		if gerr == nil {
			if old, derr := proto.DecodePause(e.Value()); derr == nil {
				return ProjectChange{Project: key, Paused: true, Pause: old}, nil
			}
		}
		err = gerr
	}
	if err != nil {
		s.log(ctx).Warn("pausing project", zap.String("project", key), zap.Error(err))
		return ProjectChange{}, refuse(http.StatusServiceUnavailable, "pausing %s: %v", key, err)
	}
	s.log(ctx).Info("project paused", zap.String("project", key), zap.String("by", by))
	return ProjectChange{Project: key, Paused: true, Pause: pz}, nil
}

// Resume lifts the operator's pause of the project key: the runners
// release its held jobs (reason operator) into the queue again.
func (s *Service) Resume(ctx context.Context, key string) (ProjectChange, error) {
	if _, ok := s.cfg.Registry().ByKey(key); !ok {
		return ProjectChange{}, refuse(http.StatusNotFound, "no such project")
	}
	kv, err := s.pausesBucket(ctx)
	if err != nil {
		return ProjectChange{}, err
	}
	if err := kv.Delete(ctx, proto.ProjectPauseKey(key)); err != nil {
		s.log(ctx).Warn("resuming project", zap.String("project", key), zap.Error(err))
		return ProjectChange{}, refuse(http.StatusServiceUnavailable, "resuming %s: %v", key, err)
	}
	s.log(ctx).Info("project resumed", zap.String("project", key))
	return ProjectChange{Project: key, Paused: false}, nil
}
