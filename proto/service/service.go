// Package service is the plumbing every orch service shares: the common
// ORCH_ settings, the zap logger, the NATS connection with the topology
// ensured, and the main function that maps signals and errors.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orch-dev/orch/proto"
)

// Defaults of the common settings.
const (
	NATSURLDefault   = "nats://127.0.0.1:4222"
	LogLevelDefault  = "info"
	LogFormatDefault = "json"
	DataDirDefault   = "./.data"
)

// EnvPrefix is the prefix of every orch environment variable.
const EnvPrefix = "ORCH_"

// Common holds the settings every service reads.
type Common struct {
	// NATSURL lists NATS servers, comma-separated. Default NATSURLDefault.
	NATSURL string `env:"NATS_URL"`
	// NATSCreds is a credentials file for a secured cluster.
	NATSCreds string `env:"NATS_CREDS"`
	// LogLevel is debug, info, warn or error. Default "info".
	LogLevel string `env:"LOG_LEVEL"`
	// LogFormat is json or console. Default "json".
	LogFormat string `env:"LOG_FORMAT"`
	// DataDir holds local state. Default "./.data".
	DataDir string `env:"DATA_DIR"`
	// StreamReplicas of every stream and bucket orch creates. Default 1.
	StreamReplicas int `env:"STREAM_REPLICAS"`
	// DuplicateWindow of the JOBS stream. Default 10m.
	DuplicateWindow time.Duration `env:"DUPLICATE_WINDOW"`
	// StatusTTL is how long a job's status record is kept. Default 168h.
	StatusTTL time.Duration `env:"STATUS_TTL"`
	// LogMaxAge is how long agents' output is kept in JOBS_LOGS. Default 168h.
	LogMaxAge time.Duration `env:"LOG_MAX_AGE"`
	// LogMaxBytes bounds JOBS_LOGS; the oldest output goes first. Default 1GiB.
	LogMaxBytes ByteSize `env:"LOG_MAX_BYTES"`
}

// SetDefaults fills the zero fields with their defaults.
func (c *Common) SetDefaults() {
	c.NATSURL = cmp.Or(c.NATSURL, NATSURLDefault)
	c.LogLevel = cmp.Or(c.LogLevel, LogLevelDefault)
	c.LogFormat = cmp.Or(c.LogFormat, LogFormatDefault)
	c.DataDir = cmp.Or(c.DataDir, DataDirDefault)
	c.StreamReplicas = cmp.Or(c.StreamReplicas, 1)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, proto.DuplicateWindowDefault)
	c.StatusTTL = cmp.Or(c.StatusTTL, proto.StatusTTLDefault)
	c.LogMaxAge = cmp.Or(c.LogMaxAge, proto.LogMaxAgeDefault)
	c.LogMaxBytes = cmp.Or(c.LogMaxBytes, proto.LogMaxBytesDefault)
}

// Topology is the stream layout these settings ask for.
func (c *Common) Topology() proto.Topology {
	return proto.Topology{Replicas: c.StreamReplicas, DuplicateWindow: c.DuplicateWindow, StatusTTL: c.StatusTTL,
		LogMaxAge: c.LogMaxAge, LogMaxBytes: int64(c.LogMaxBytes)}
}

// FromEnv parses cfg (a pointer to a service's Config) from the ORCH_
// environment variables.
func FromEnv(cfg any) error {
	if err := env.ParseWithOptions(cfg, env.Options{Prefix: EnvPrefix}); err != nil {
		return fmt.Errorf("reading configuration: %w", err)
	}
	return nil
}

// logOutputs is where loggers write: standard error (tests add a file).
var logOutputs = []string{"stderr"}

// NewLogger builds the zap logger the common settings ask for.
func NewLogger(c Common, name string) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cmp.Or(c.LogLevel, LogLevelDefault))
	if err != nil {
		return nil, fmt.Errorf("ORCH_LOG_LEVEL: %w", err)
	}
	var zc zap.Config
	switch cmp.Or(c.LogFormat, LogFormatDefault) {
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
// the topology. The caller closes the connection.
func Connect(ctx context.Context, c Common, name string, log *zap.Logger) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue, error) {
	opts := []nats.Option{
		nats.Name("orch-" + name),
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
		}),
	}
	if c.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	}
	nc, err := nats.Connect(cmp.Or(c.NATSURL, NATSURLDefault), opts...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connecting to nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	// The server may still be starting (RetryOnFailedConnect): keep trying
	// the topology until it answers or ctx ends.
	var kv jetstream.KeyValue
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err = c.Topology().Ensure(tctx, js)
		cancel()
		if err == nil {
			return nc, js, kv, nil
		}
		log.Warn("ensuring topology, will retry", zap.Error(err))
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, nil, nil, fmt.Errorf("ensuring topology: %w", errors.Join(ctx.Err(), err))
		case <-time.After(time.Second):
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
