package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/proto"
)

// Publish puts job's message on StreamJobs with Nats-Msg-Id msgID.
type Publish func(ctx context.Context, job *proto.Job, msgID string) error

// PublishTo is the Publish of a JetStream context: the job on its subject.
func PublishTo(js jetstream.JetStream) Publish {
	return func(ctx context.Context, job *proto.Job, msgID string) error {
		data, err := json.Marshal(job)
		if err != nil {
			return err
		}
		if _, err := js.Publish(ctx, proto.JobSubject(job.Project, job.Kind), data, jetstream.WithMsgID(msgID)); err != nil {
			return fmt.Errorf("publishing job %s: %w", job.ID, err)
		}
		return nil
	}
}

// ReleaseHeld ends the hold of job id: it publishes the job again, with
// the hold's own message id (proto.HeldMsgID), then applies Release(by).
// The message goes first, so a releaser that stops in between leaves the
// job held, and the next one publishes it again under the same id, which
// JetStream's duplicate window drops; two releasers racing publish one
// message and one of them records the release. A runner may pull the new
// message before the record says queued; StartAttempt accepts a held
// record. A job that is not held is ErrNotHeld (ErrNotFound without a
// record), and nothing is published.
func (s *Store) ReleaseHeld(ctx context.Context, id, by string, publish Publish) (*proto.Status, error) {
	cur, rev, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if cur.State != proto.StateHeld {
		return cur, fmt.Errorf("release %s: %w", id, ErrNotHeld)
	}
	if err := publish(ctx, &cur.Job, proto.HeldMsgID(id, cur.Holds)); err != nil {
		return nil, err
	}
	holds := cur.Holds
	st, err := s.ApplyFrom(ctx, &cur.Job, cur, rev, Release(by))
	if errors.Is(err, ErrNotHeld) && st != nil && st.Holds == holds {
		// Another releaser recorded it, or a runner already took the
		// message: released all the same.
		return st, nil
	}
	return st, err
}
