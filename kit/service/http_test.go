package service_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/orch-dev/orch/kit/service"
)

// /readyz says ready or why not, and a service's detail joins either
// answer.
func TestReadyzCarriesTheDetail(t *testing.T) {
	t.Parallel()
	detail := func() map[string]any { return map[string]any{"spool": map[string]any{"depth": 2.0}} }
	for _, tc := range []struct {
		name   string
		ready  error
		detail func() map[string]any
		code   int
		want   map[string]any
	}{
		{"ready", nil, nil, http.StatusOK, map[string]any{"status": "ready"}},
		{"not ready", errors.New("nats: not connected yet"), nil, http.StatusServiceUnavailable, map[string]any{"error": "nats: not connected yet"}},
		{"ready with detail", nil, detail, http.StatusOK, map[string]any{"status": "ready", "spool": map[string]any{"depth": 2.0}}},
		{"not ready with detail", errors.New("nats: RECONNECTING"), detail, http.StatusServiceUnavailable,
			map[string]any{"error": "nats: RECONNECTING", "spool": map[string]any{"depth": 2.0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			service.Readyz(func() error { return tc.ready }, tc.detail).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			var got map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != tc.code {
				t.Fatalf("%d %s (%v), want %d", w.Code, w.Body, err, tc.code)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("body %v, want %v", got, tc.want)
			}
		})
	}
}
