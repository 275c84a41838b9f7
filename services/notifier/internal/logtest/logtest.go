// Package logtest gives the notifier's tests a logger whose lines they
// can read back, and that fails the test when a secret reaches any line:
// tokens must never be logged, whatever path a test takes.
package logtest

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// New returns a logger that writes to the test's log from info level up
// and keeps every line, debug included, in the returned observer. When
// the test ends, a line (message or fields) containing any of secrets
// fails it.
func New(t testing.TB, secrets ...string) (*zap.Logger, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), core))
	t.Cleanup(func() {
		for _, e := range logs.All() {
			line := e.Message + fmt.Sprint(e.ContextMap())
			for _, s := range secrets {
				if strings.Contains(line, s) {
					t.Errorf("a secret reached a log line: %s", line)
					break
				}
			}
		}
	})
	return log, logs
}
