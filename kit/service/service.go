// Package service is the plumbing every orch service shares: the common
// ORCH_ settings, the zap logger, the NATS connection with the topology
// ensured, and the main function that maps signals and errors.
package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/proto"
)

// EnvPrefix is the prefix of every orch environment variable.
const EnvPrefix = "ORCH_"

// Common holds the settings every service reads. The defaults of every
// service's settings are the envDefault tags of its Config, and only
// there (see FromEnv and SetDefaults).
type Common struct {
	// NATSURL lists NATS servers, comma-separated.
	NATSURL string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	// NATSCreds is a credentials file (a user JWT and its nkey seed).
	NATSCreds string `env:"NATS_CREDS"`
	// NATSUser and NATSPassword (or NATSPasswordFile, the file holding
	// it) log in as a user of the server's authorization block: one per
	// service (kit/natsauth). The password is never logged.
	NATSUser         string `env:"NATS_USER"`
	NATSPassword     Secret `env:"NATS_PASSWORD"`
	NATSPasswordFile string `env:"NATS_PASSWORD_FILE"`
	// NATSNKeySeedFile is the file of an nkey user's seed.
	NATSNKeySeedFile string `env:"NATS_NKEY_SEED_FILE"`
	// NATSCAFile verifies the server's certificate (TLS); NATSCertFile
	// and NATSKeyFile are the client's own, for servers that verify
	// clients.
	NATSCAFile   string `env:"NATS_CA_FILE"`
	NATSCertFile string `env:"NATS_CERT_FILE"`
	NATSKeyFile  string `env:"NATS_KEY_FILE"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// LogFormat is json or console.
	LogFormat string `env:"LOG_FORMAT" envDefault:"json"`
	// DataDir holds local state.
	DataDir string `env:"DATA_DIR" envDefault:"./.data"`
	// StreamReplicas of every stream and bucket orch creates.
	StreamReplicas int `env:"STREAM_REPLICAS" envDefault:"1"`
	// DuplicateWindow of the JOBS stream (proto.DuplicateWindowDefault).
	DuplicateWindow time.Duration `env:"DUPLICATE_WINDOW" envDefault:"10m"`
	// StatusTTL is how long a job's status record is kept
	// (proto.StatusTTLDefault).
	StatusTTL time.Duration `env:"STATUS_TTL" envDefault:"168h"`
	// LogMaxAge is how long agents' output is kept in JOBS_LOGS
	// (proto.LogMaxAgeDefault).
	LogMaxAge time.Duration `env:"LOG_MAX_AGE" envDefault:"168h"`
	// LogMaxBytes bounds JOBS_LOGS; the oldest output goes first
	// (proto.LogMaxBytesDefault).
	LogMaxBytes ByteSize `env:"LOG_MAX_BYTES" envDefault:"1GiB"`

	// fromEnv is set by FromEnv, whose envDefault tags filled what the
	// environment left unset: SetDefaults then leaves every value, an
	// explicit zero included, as the operator gave it.
	fromEnv bool
}

// common gives FromEnv and SetDefaults the Common of any service's Config.
func (c *Common) common() *Common { return c }

type hasCommon interface{ common() *Common }

// Topology is the stream layout these settings ask for.
func (c *Common) Topology() proto.Topology {
	return proto.Topology{Replicas: c.StreamReplicas, DuplicateWindow: c.DuplicateWindow, StatusTTL: c.StatusTTL,
		LogMaxAge: c.LogMaxAge, LogMaxBytes: int64(c.LogMaxBytes)}
}

// FromEnv parses cfg (a pointer to a service's Config) from the ORCH_
// environment variables; a variable that is not set takes its field's
// envDefault, one that is set is honoured, zero included.
func FromEnv(cfg any) error { return Parse(cfg, nil) }

// Parse is FromEnv over environ instead of the process's environment (nil:
// the process's).
func Parse(cfg any, environ map[string]string) error {
	if err := env.ParseWithOptions(cfg, env.Options{Prefix: EnvPrefix, Environment: environ}); err != nil {
		return fmt.Errorf("reading configuration: %w", err)
	}
	if c, ok := cfg.(hasCommon); ok {
		c.common().fromEnv = true
		return c.common().validate()
	}
	return nil
}

// validate rejects an explicit zero where the topology would silently
// put its default in its place: these settings have no "off".
func (c *Common) validate() error {
	var errs []error
	for _, s := range []struct {
		name string
		zero bool
	}{
		{"ORCH_DUPLICATE_WINDOW", c.DuplicateWindow <= 0},
		{"ORCH_STATUS_TTL", c.StatusTTL <= 0},
		{"ORCH_LOG_MAX_AGE", c.LogMaxAge <= 0},
		{"ORCH_LOG_MAX_BYTES", c.LogMaxBytes <= 0},
	} {
		if s.zero {
			errs = append(errs, fmt.Errorf("%s must be positive", s.name))
		}
	}
	if c.StreamReplicas < 1 {
		errs = append(errs, errors.New("ORCH_STREAM_REPLICAS must be at least 1"))
	}
	if _, err := c.natsAuth(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// logOutputs is where loggers write: standard error (tests add a file).
var logOutputs = []string{"stderr"}

// SetDefaults gives every zero field of cfg (a pointer to a service's
// Config built in Go, as tests and orch-local do) its envDefault. A Config
// read by FromEnv has its defaults already and is left alone, so that an
// explicit ORCH_NOTIFY_RETRY_DELAY=0 stays 0.
func SetDefaults(cfg any) {
	if c, ok := cfg.(hasCommon); ok && c.common().fromEnv {
		return
	}
	v := reflect.ValueOf(cfg).Elem()
	defaults := reflect.New(v.Type())
	// Parsing an empty environment leaves exactly the envDefault values.
	if err := env.ParseWithOptions(defaults.Interface(), env.Options{Prefix: EnvPrefix, Environment: map[string]string{}}); err != nil {
		panic(fmt.Sprintf("envDefault tags of %s: %v", v.Type(), err)) // a typo in a tag: caught by every test
	}
	fillZero(v, defaults.Elem())
}

// fillZero copies each field of def into the zero fields of v, walking
// into embedded structs. A field tagged default:"env-only" keeps its zero
// in Go (a listen address: several services may share a test's process).
func fillZero(v, def reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case !f.CanSet(), v.Type().Field(i).Tag.Get("default") == "env-only":
		case v.Type().Field(i).Anonymous && f.Kind() == reflect.Struct:
			fillZero(f, def.Field(i))
		case f.IsZero():
			f.Set(def.Field(i))
		}
	}
}

// Default returns a T (a service's Config) holding its defaults.
func Default[T any]() T {
	var cfg T
	SetDefaults(&cfg)
	return cfg
}

// NewLogger builds the zap logger the common settings ask for.
func NewLogger(c Common, name string) (*zap.Logger, error) {
	SetDefaults(&c)
	level, err := zapcore.ParseLevel(c.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("ORCH_LOG_LEVEL: %w", err)
	}
	var zc zap.Config
	switch c.LogFormat {
	case "json":
		zc = zap.NewProductionConfig()
		// Timestamps a person and a log pipeline both read (RFC 3339,
		// UTC offset included), and durations as Go's duration strings
		// ("1m30s"), so no number in a log line has an unnamed unit.
		zc.EncoderConfig.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		zc.EncoderConfig.EncodeDuration = zapcore.StringDurationEncoder
	case "console":
		zc = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("ORCH_LOG_FORMAT: want json or console, got %q", c.LogFormat)
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.Sampling = nil
	zc.DisableStacktrace = true
	zc.OutputPaths = append([]string(nil), logOutputs...)
	log, err := zc.Build()
	if err != nil {
		return nil, fmt.Errorf("building logger: %w", err)
	}
	return log.Named(name), nil
}

// Connect connects to NATS with reconnects that never give up, and ensures
// the topology. rc, if not nil, hears of every reconnect. The caller closes the connection. name is the service
// (gateway, runner, notifier): its replies arrive under its own inbox
// prefix (natsauth.InboxPrefix), which its NATS user alone may read. A
// server that refuses what the service asks (a permission violation) is
// logged at warn; one that refuses its login closes the connection, and
// Connect returns that error.
func Connect(ctx context.Context, c Common, name string, rc *Reconnects, log *zap.Logger) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue, error) {
	SetDefaults(&c)
	auth, err := c.natsAuth()
	if err != nil {
		return nil, nil, nil, err
	}
	// Closed for good (a refused login, given up after twice): start-up
	// stops waiting for JetStream.
	ctx, closed := context.WithCancelCause(ctx)
	defer closed(nil)
	opts := []nats.Option{
		nats.Name("orch-" + name),
		nats.CustomInboxPrefix(natsauth.InboxPrefix(name)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil on a deliberate close
				log.Warn("nats disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", zap.String("url", nc.ConnectedUrlRedacted()))
			rc.reconnected()
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			// "Permissions Violation for Publish to ...": a call this
			// service's NATS user may not make (see docs/deploy.md).
			fields := []zap.Field{zap.Error(err)}
			if sub != nil {
				fields = append(fields, zap.String("subject", sub.Subject))
			}
			log.Warn("nats error", fields...)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			// Closed by the server for a login refused or expired (twice
			// over: nats.go gives up then). A deliberate Close may leave
			// another last error, which is no reason.
			if err := nc.LastError(); isAuthError(err) {
				log.Error("nats connection closed", zap.Error(err))
				closed(fmt.Errorf("nats connection closed: %w", err))
			}
		}),
	}
	opts = append(opts, auth...)
	nc, err := nats.Connect(c.NATSURL, opts...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connecting to nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	// The server may still be starting (RetryOnFailedConnect).
	var kv jetstream.KeyValue
	err = Retry(ctx, log, "ensuring topology", func(ctx context.Context) (err error) {
		kv, err = c.Topology().Ensure(ctx, js)
		return err
	})
	if err != nil {
		nc.Close()
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		return nil, nil, nil, err
	}
	return nc, js, kv, nil
}

// isAuthError reports whether err is the server refusing a login.
func isAuthError(err error) bool {
	for _, e := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Retry runs step, a start-up call to JetStream, until it succeeds or ctx
// ends, each try within 5s. A failed try is logged and made again a
// second later: a server still starting, a cluster electing a leader or a
// stream not yet placed on its peers answers in time, and a service that
// starts in those moments should not exit for it.
func Retry(ctx context.Context, log *zap.Logger, what string, step func(context.Context) error) error {
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := step(tctx)
		cancel()
		if err == nil {
			return nil
		}
		log.Warn(what+", will retry", zap.Error(err))
		if !backoff.Sleep(ctx, time.Second) {
			return fmt.Errorf("%s: %w", what, errors.Join(ctx.Err(), err))
		}
	}
}

// Main runs a service: it cancels the context on SIGINT or SIGTERM, logs
// the error run returns and exits non-zero on it.
func Main(log *zap.Logger, run func(context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("exiting", zap.Error(err))
		_ = log.Sync()
		os.Exit(1)
	}
	_ = log.Sync()
}

// Fatal prints err for a service that could not even build its logger.
func Fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}
