package service

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// TestJSONLogLine pins what a log pipeline reads: one JSON object a line,
// an RFC 3339 timestamp, durations as strings that carry their unit.
func TestJSONLogLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.json")
	logOutputs = []string{path}
	t.Cleanup(func() { logOutputs = []string{"stderr"} })

	log, err := NewLogger(Common{LogFormat: "json"}, "runner")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("job done", zap.String("job", "j1"), zap.Duration("took", 90*time.Second))
	_ = log.Sync()

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	if err := json.Unmarshal(data, &line); err != nil {
		t.Fatalf("log line is not one JSON object: %v\n%s", err, data)
	}
	ts, _ := line["ts"].(string)
	if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("ts = %v, want an RFC 3339 timestamp: %v", line["ts"], err)
	}
	if line["took"] != "1m30s" {
		t.Errorf("took = %v, want the duration string 1m30s", line["took"])
	}
	if line["logger"] != "runner" || line["job"] != "j1" || line["msg"] != "job done" {
		t.Errorf("log line = %v", line)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServeHTTP(t *testing.T) {
	var notReady atomic.Pointer[error]
	e := errors.New("nats: not connected yet")
	notReady.Store(&e)
	h, err := ServeHTTP("127.0.0.1:0", nil, NewRegistry("runner"), func() error {
		if p := notReady.Load(); p != nil {
			return *p
		}
		return nil
	}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	base := "http://" + h.Addr()

	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not connected") {
		t.Errorf("/readyz before ready = %d %s, want 503 with the reason", code, body)
	}
	notReady.Store(nil)
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once ready = %d, want 200", code)
	}

	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	if !strings.Contains(body, `orch_build_info{goversion="go`) || !strings.Contains(body, `service="runner",version="dev"} 1`) {
		t.Errorf("/metrics lacks orch_build_info:\n%s", body)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestServeHTTPWithoutAddressServesNothing(t *testing.T) {
	h, err := ServeHTTP("", nil, NewRegistry("notifier"), func() error { return nil }, zaptest.NewLogger(t))
	if err != nil || h != nil {
		t.Fatalf("ServeHTTP without address = %v, %v; want nil, nil", h, err)
	}
	h.Stop() // a nil *HTTP stops as a no-op
}

// A setting the topology cannot honour at zero is refused, naming the
// variable, rather than quietly replaced by its default; unset, it takes
// its default.
func TestZeroTopologySettingsRefused(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"ORCH_DUPLICATE_WINDOW", "ORCH_STATUS_TTL", "ORCH_LOG_MAX_AGE", "ORCH_LOG_MAX_BYTES", "ORCH_STREAM_REPLICAS"} {
		var c struct{ Common }
		err := Parse(&c, map[string]string{name: "0"})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=0: error %v, want one naming it", name, err)
		}
	}
	var c struct{ Common }
	if err := Parse(&c, map[string]string{}); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	if c.LogMaxAge != 168*time.Hour || c.LogMaxBytes != 1<<30 {
		t.Errorf("defaults: %+v", c.Common)
	}
}

// A start-up step that fails while the server is not ready is tried again
// until it succeeds; one that never does ends with the context, with its
// last error.
func TestRetry(t *testing.T) {
	t.Parallel()
	log := zaptest.NewLogger(t)
	calls := 0
	err := Retry(t.Context(), log, "opening", func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a try has no deadline")
		}
		if calls++; calls < 3 {
			return errors.New("nats: bucket not found")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Retry = %v after %d calls, want nil after 3", err, calls)
	}

	ctx, cancel := context.WithCancel(t.Context())
	err = Retry(ctx, log, "opening", func(context.Context) error {
		cancel()
		return errors.New("nats: timeout")
	})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "opening") || !strings.Contains(err.Error(), "nats: timeout") {
		t.Fatalf("Retry after cancel = %v", err)
	}
}
