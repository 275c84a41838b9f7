// Package jobs is what the gateway knows about jobs, behind both of its
// HTTP faces: the JSON API (package api) and the dashboard (package ui)
// ask it to read a job, its attempts and their logs, the queue and the
// dead letters, and to queue, cancel or retry a job. The faces only
// translate: a request into a call here, the answer or the Refusal back
// into HTTP. So a cancel from a page and one from curl run the same code,
// and a new action on jobs is written once, here.
//
// Jobs arrive from webhooks through package queue, not through here:
// intake is its own path (webhook → trigger → queue), and this package
// only reads what it made and acts on it.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/queue"
)

// Config is what the job service works with.
type Config struct {
	// Queue publishes the jobs queued by hand and carries out cancels;
	// its spool's figures are part of the queue's summary.
	Queue *queue.Queue
	// Index is the KV-watched index of every job the lists show.
	Index *index.Index
	// Registry returns the project registry in force (SIGHUP reloads it).
	Registry func() *registry.Registry
	// Now is the clock of the jobs made here; nil means time.Now.
	Now func() time.Time
	// BudgetLoc is the budgets' calendar (ORCH_BUDGET_TZ), for the spend
	// shown; nil means UTC.
	BudgetLoc *time.Location
	// Log is the service's logger, used for calls whose context carries
	// none (see WithLog).
	Log *zap.Logger
}

// Service answers both faces' questions about jobs. Connect gives it NATS
// once NATS is reachable; until then what needs NATS is refused with 503.
type Service struct {
	cfg  Config
	conn atomic.Pointer[conn]

	// closed ends with Close: the followed logs' lifetime.
	closed context.Context
	end    context.CancelFunc
}

type conn struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	status *status.Store
}

// New returns the job service.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Service{cfg: cfg}
	s.closed, s.end = context.WithCancel(context.Background())
	return s
}

// life is the context that Close ends.
func (s *Service) life() context.Context { return s.closed }

// Connect gives the service its NATS connection, once there is one.
func (s *Service) Connect(nc *nats.Conn, js jetstream.JetStream, st *status.Store) {
	s.conn.Store(&conn{nc: nc, js: js, status: st})
}

// Ready reports why the service cannot reach JetStream now, or nil: the
// gateway's /readyz.
func (s *Service) Ready() error {
	switch c := s.conn.Load(); {
	case c == nil:
		return errors.New("nats: not connected yet")
	case c.nc.Status() != nats.CONNECTED:
		return errors.New("nats: " + c.nc.Status().String())
	}
	return nil
}

// connected returns the connection, or the 503 Refusal that says there is
// none yet.
func (s *Service) connected() (*conn, error) {
	c := s.conn.Load()
	if c == nil {
		return nil, refuse(http.StatusServiceUnavailable, "JetStream unavailable: not connected to NATS yet")
	}
	return c, nil
}

func (s *Service) nowUTC() time.Time { return s.cfg.Now().UTC() }

// Refusal is a request the service did not carry out, with the HTTP
// status that says why and a message for a person. Both faces are HTTP,
// so the status is the kind of refusal: 400 a bad request, 404 no such
// job, 409 not in a state for it, 503 JetStream away (try again). The
// JSON API and the dashboard show the message as it is.
type Refusal struct {
	Code int
	Msg  string
}

func (e *Refusal) Error() string { return e.Msg }

func refuse(code int, format string, args ...any) error {
	return &Refusal{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// RefusalOf is err as a Refusal: itself when it is one, else a 503 with
// its text (what failed was reaching something).
func RefusalOf(err error) *Refusal {
	var ref *Refusal
	if errors.As(err, &ref) {
		return ref
	}
	return &Refusal{Code: http.StatusServiceUnavailable, Msg: err.Error()}
}

// Ref names one job in an answer. Duplicate says the job existed before
// (the same request or event again).
type Ref struct {
	ID        string     `json:"id"`
	Kind      proto.Kind `json:"kind"`
	Project   string     `json:"project"`
	Task      string     `json:"task"`
	Duplicate bool       `json:"duplicate,omitempty"`
}

// RefOf is the Ref of j.
func RefOf(j *proto.Job) Ref {
	return Ref{ID: j.ID, Kind: j.Kind, Project: j.Project, Task: j.Task.ID}
}

type logKey struct{}

// WithLog returns ctx carrying log, the logger of the request ctx belongs
// to, so that the service's lines about the request carry its fields
// (its request id).
func WithLog(ctx context.Context, log *zap.Logger) context.Context {
	return context.WithValue(ctx, logKey{}, log)
}

// LogFrom is the logger ctx carries (WithLog), or nil.
func LogFrom(ctx context.Context) *zap.Logger {
	l, _ := ctx.Value(logKey{}).(*zap.Logger)
	return l
}

// log is the logger of the request ctx belongs to, else the service's.
func (s *Service) log(ctx context.Context) *zap.Logger {
	if l := LogFrom(ctx); l != nil {
		return l
	}
	return s.cfg.Log
}
