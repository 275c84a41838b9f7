package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/scrub"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/agent"
)

// Holds: a job that may not start now is held, not run and not failed
// (see kit/status's Hold). Before it starts a job, the runner asks
// holdFor whether its project is paused by an operator, the model
// credential is paused at its usage limit, or the project's budget is
// spent in a window; if so it records the job held and acks its message
// (decide's onHold row), so waiting spends none of its deliveries. The
// releaser (release.go) publishes it again when the hold ends.

// usagePauseDefault is how long a usage limit pauses its credential when
// the agent did not say when the limit resets.
const usagePauseDefault = time.Hour

// holdFor says why job may not start now (a proto.Hold* reason) and until
// when, where that is known; "" when it may. A job released by hand runs
// whatever holds it: that is its record's to say, which the caller reads.
// A bucket that cannot be read holds nothing: the limits are bookkeeping,
// and an outage of them does not stop the fleet. The reads do not depend
// on each other, so they go out together.
func (r *Runner) holdFor(ctx context.Context, log *zap.Logger, job *proto.Job, p *registry.Project) (reason string, until time.Time) {
	if job.Kind == proto.KindCleanup {
		return "", time.Time{}
	}
	now := time.Now()
	var (
		reads               sync.WaitGroup
		project, credential *proto.Pause
		projectErr, credErr error
		spent               = make([]float64, len(proto.Windows))
		spentErr            = make([]error, len(proto.Windows))
	)
	reads.Go(func() { project, projectErr = r.pause(ctx, proto.ProjectPauseKey(job.Project)) })
	reads.Go(func() { credential, credErr = r.pause(ctx, proto.UsagePauseKey(r.credID)) })
	for i, w := range proto.Windows {
		if p.Budget.Limit(w) > 0 {
			reads.Go(func() { spent[i], spentErr[i] = r.spent(ctx, job.Project, w, now) })
		}
	}
	reads.Wait()
	if projectErr != nil {
		log.Warn("reading the project's pause", zap.Error(projectErr))
	} else if project != nil && project.Active(now) {
		return proto.HoldOperator, project.Until
	}
	if credErr != nil {
		log.Warn("reading the credential's pause", zap.Error(credErr))
	} else if credential != nil && credential.Active(now) {
		return proto.HoldUsageLimit, credential.Until
	}
	for i, w := range proto.Windows {
		limit := p.Budget.Limit(w)
		switch {
		case limit <= 0:
		case spentErr[i] != nil:
			log.Warn("reading the project's spend", zap.String("window", w), zap.Error(spentErr[i]))
		case spent[i] >= limit:
			return proto.HoldOverBudget, proto.WindowEnd(w, now, r.loc)
		}
	}
	return "", time.Time{}
}

// pause reads the pause under key; nil when there is none.
func (r *Runner) pause(ctx context.Context, key string) (*proto.Pause, error) {
	e, err := r.pauses.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return proto.DecodePause(e.Value())
}

// spent is project's spend in the window of kind w holding now.
func (r *Runner) spent(ctx context.Context, project, w string, now time.Time) (float64, error) {
	e, err := r.spendKV.Get(ctx, proto.SpendKey(project, w, now, r.loc))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s, err := proto.DecodeSpend(e.Value())
	if err != nil {
		return 0, err
	}
	return s.USD, nil
}

// left is what is left of p's budget now, the least over its windows; ok
// is false when it has none.
func (r *Runner) left(ctx context.Context, p *registry.Project) (usd float64, ok bool) {
	now := time.Now()
	for _, w := range proto.Windows {
		limit := p.Budget.Limit(w)
		if limit <= 0 {
			continue
		}
		spent, err := r.spent(ctx, p.Key, w, now)
		if err != nil {
			continue
		}
		if l := max(0, limit-spent); !ok || l < usd {
			usd, ok = l, true
		}
	}
	return usd, ok
}

// jobCap is the most an attempt of job may spend by Claude Code's own
// --max-budget-usd: the least of the project's max_cost_usd for the kind
// and what is left of its budget; 0 is no cap. Only Claude Code takes
// such a limit: for another agent it is 0, and nothing is read.
func (r *Runner) jobCap(ctx context.Context, job *proto.Job, p *registry.Project) float64 {
	if !agent.IsClaude(r.commandOf(p)) {
		return 0
	}
	c := p.MaxCostUSD.For(string(job.Kind))
	if left, ok := r.left(ctx, p); ok && left > 0 && (c <= 0 || left < c) {
		c = left
	}
	return c
}

// addSpend adds cost, attempt's of job, to its project's spend in every
// window, once: the increment is a compare-and-set of the window's sum
// that names the attempt, so two runners never lose one, and a settle
// applied again finds its attempt counted.
func (r *Runner) addSpend(ctx context.Context, log *zap.Logger, job *proto.Job, attempt int, cost float64) {
	now := time.Now()
	id := fmt.Sprintf("%s/%d", job.ID, attempt)
	for _, w := range proto.Windows {
		key := proto.SpendKey(job.Project, w, now, r.loc)
		err := retry(ctx, func() error { return r.addSpendTo(ctx, key, id, cost, now) })
		if err != nil {
			log.Warn("adding to the project's spend", zap.String("key", key), zap.Error(err))
		}
	}
	r.metrics.spend.WithLabelValues(r.metrics.projectLabel(job.Project)).Add(cost)
}

func (r *Runner) addSpendTo(ctx context.Context, key, id string, cost float64, now time.Time) error {
	for range 100 {
		var (
			s   proto.Spend
			rev uint64
		)
		e, err := r.spendKV.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			cur, err := proto.DecodeSpend(e.Value())
			if err != nil {
				return err
			}
			s, rev = *cur, e.Revision()
		}
		if slices.Contains(s.Counted, id) {
			return nil
		}
		s.USD += cost
		s.Counted = append(s.Counted, id)
		if n := len(s.Counted); n > proto.SpendCountedMax {
			s.Counted = s.Counted[n-proto.SpendCountedMax:]
		}
		s.UpdatedAt = now.UTC()
		data, err := json.Marshal(s)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = r.spendKV.Create(ctx, key, data)
		} else {
			_, err = r.spendKV.Update(ctx, key, data, rev)
		}
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return err
		}
	}
	return fmt.Errorf("adding to %s: too many concurrent writers", key)
}

// isConflict reports a compare-and-set that lost to another writer.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// pauseCredential records that the agent of job met its credential's
// usage limit: a pause of the credential until out.holdUntil, so that no
// runner starts an agent into the same wall. A pause already there is
// lengthened, never shortened, and keeps its start, so the notifier tells
// of it once.
func (r *Runner) pauseCredential(ctx context.Context, log *zap.Logger, job *proto.Job, out outcome) {
	key := proto.UsagePauseKey(r.credID)
	now := time.Now().UTC()
	err := retry(ctx, func() error {
		for range 20 {
			pz := proto.Pause{Schema: proto.SchemaVersion, Reason: proto.HoldUsageLimit, Since: now, Until: out.holdUntil.UTC(),
				By: r.cfg.Name, Job: job.ID}
			if out.err != nil {
				pz.Note = scrubbed(scrub.Scrubber{Secrets: r.secrets()}, out.err.Error(), errorMax, "error text")
			}
			e, err := r.pauses.Get(ctx, key)
			var rev uint64
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				return err
			default:
				rev = e.Revision()
				if cur, err := proto.DecodePause(e.Value()); err == nil && cur.Active(now) {
					if !cur.Until.Before(pz.Until) {
						return nil
					}
					pz.Since, pz.Job, pz.Note = cur.Since, cur.Job, cur.Note
				}
			}
			data, err := json.Marshal(pz)
			if err != nil {
				return err
			}
			if rev == 0 {
				_, err = r.pauses.Create(ctx, key, data)
			} else {
				_, err = r.pauses.Update(ctx, key, data, rev)
			}
			if err == nil || !isConflict(err) {
				return err
			}
		}
		return errors.New("too many concurrent writers")
	})
	if err != nil {
		log.Error("recording the usage-limit pause", zap.Error(err))
		return
	}
	log.Warn("usage limit met: no agent starts on this credential until it resets",
		zap.String("credential", r.credID), zap.Time("until", out.holdUntil))
}

// credentialID names the model credential the runner's agents use, by
// proto.CredentialID: Claude Code's OAuth token (a subscription login)
// when set, else the API key.
func credentialID() string {
	if t := os.Getenv("CLAUDE_CODE_OAUTH_TOKEN"); t != "" {
		return proto.CredentialID(t)
	}
	return proto.CredentialID(os.Getenv("ANTHROPIC_API_KEY"))
}
