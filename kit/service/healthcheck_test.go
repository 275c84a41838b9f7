package service

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// childEnv makes this test binary act as a service's main: it calls
// HandleFlags with the arguments after "--" and, if that returns, exits 3
// (the flags handled nothing).
const childEnv = "ORCH_TEST_HANDLE_FLAGS"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{os.Args[0]}, os.Args[i+1:]...)
				break
			}
		}
		HandleFlags("notifier", "v1.2.3")
		os.Exit(3)
	}
	goleak.VerifyTestMain(m)
}

// runFlags runs this test binary as a service binary with args, and
// returns its exit code and output.
func runFlags(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("running %v: %v", args, err)
	return 0, ""
}

// `<binary> -healthcheck <url>` is what a container health check runs in
// images without wget or curl: exit 0 when the URL answers 2xx, 1 when it
// answers otherwise or nothing listens, saying why.
func TestHealthcheckFlag(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			http.Error(w, "nats: not connected yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	t.Cleanup(srv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()

	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"healthy", []string{"-healthcheck", srv.URL + "/healthz"}, 0, ""},
		{"not ready", []string{"-healthcheck", srv.URL + "/readyz"}, 1, "503 Service Unavailable: nats: not connected yet"},
		{"nothing listens", []string{"-healthcheck", closed}, 1, "connection refused"},
		{"version", []string{"-version"}, 0, "notifier v1.2.3"},
		{"no flag runs the service", nil, 3, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out := runFlags(t, tc.args...)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("exit %d, output %q; want exit %d, output containing %q", code, out, tc.wantCode, tc.wantOut)
			}
		})
	}
}
