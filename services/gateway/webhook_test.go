package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

func TestBadInput(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, func(e *env) { e.maxBody = 64 << 10 })
	good := prBody(t, 42, "opened")
	planeBody, planeH := readFixture(t, "plane/issue__updated_labels")
	malformed := []byte(`{"action": "opened", "pull_request": {`)
	big := append([]byte(`{"pad":"`), bytes.Repeat([]byte("x"), 100<<10)...)
	big = append(big, `"}`...)
	form := []byte("payload=" + string(good))
	wrongType := testkit.EditJSON(t, good, func(v map[string]any) {
		v["pull_request"].(map[string]any)["number"] = "42"
	})
	with := func(h map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for a, b := range h {
			out[a] = b
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	tests := []struct {
		name    string
		path    string
		method  string
		headers map[string]string
		body    []byte
		code    int
	}{
		{"missing signature", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, ""), good, 401},
		{"empty signature", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, " "), good, 401},
		{"bad signature", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, "deadbeef"), good, 401},
		{"wrong secret", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaSignature, webhook.Sign("other", good)), good, 401},
		{"malformed JSON, valid signature", "/webhooks/gitea", "POST", giteaHeaders("pull_request", malformed), malformed, 400},
		{"a field orch reads has the wrong JSON type", "/webhooks/gitea", "POST", giteaHeaders("pull_request", wrongType), wrongType, 400},
		{"malformed JSON of an event orch does not act on", "/webhooks/gitea", "POST", giteaHeaders("wiki", malformed), malformed, 400},
		{"missing event type", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", good), webhook.GiteaEventType, ""), good, 400},
		{"oversized body", "/webhooks/gitea", "POST", giteaHeaders("pull_request", big), big, 413},
		{"unknown event type", "/webhooks/gitea", "POST", giteaHeaders("wiki", good), good, 200},
		{"form-encoded body", "/webhooks/gitea", "POST", with(giteaHeaders("pull_request", form), "Content-Type", "application/x-www-form-urlencoded"), form, 415},
		{"plane: wrong secret", "/webhooks/plane", "POST", with(planeH, webhook.PlaneSignature, webhook.Sign("other", planeBody)), planeBody, 401},
		{"plane: missing signature", "/webhooks/plane", "POST", with(planeH, webhook.PlaneSignature, ""), planeBody, 401},
		{"plane: malformed JSON, valid signature", "/webhooks/plane", "POST",
			with(planeH, webhook.PlaneSignature, webhook.Sign(planeSecret, malformed)), malformed, 400},
		{"plane: event header disagrees with body", "/webhooks/plane", "POST", with(planeH, webhook.PlaneEventHeader, "cycle"), planeBody, 400},
		{"wrong method", "/webhooks/gitea", "GET", nil, nil, 405},
		{"wrong method on the API", "/queue", "DELETE", nil, nil, 405},
	}
	// says holds part of the error answer of some cases: the person
	// setting up the webhook learns what is wrong.
	says := map[string]string{
		"a field orch reads has the wrong JSON type":      "pull_request.number is string, want number",
		"malformed JSON of an event orch does not act on": "not JSON",
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := g.do(t, tt.method, tt.path, tt.headers, tt.body)
			if code != tt.code {
				t.Errorf("answered %d %s, want %d", code, body, tt.code)
			}
			var ans map[string]any
			if err := json.Unmarshal(body, &ans); err != nil {
				t.Errorf("answer is not JSON: %q", body)
			}
			if code >= 400 && ans["error"] == nil {
				t.Errorf("error answer without \"error\": %s", body)
			}
			if msg, _ := ans["error"].(string); !strings.Contains(msg, says[tt.name]) {
				t.Errorf("error %q does not say %q", msg, says[tt.name])
			}
		})
	}
	_, js, kv := natstest.Connect(t, e.srv)
	if n, err := streamMsgs(js); err != nil || n != 0 {
		t.Errorf("JOBS holds %d messages (%v), want 0", n, err)
	}
	if keys, err := kv.ListKeys(context.Background()); err == nil {
		for k := range keys.Keys() {
			t.Errorf("status record %s written for bad input", k)
		}
	}
	if d := g.queue(t).Spool.Depth; d != 0 {
		t.Errorf("spool depth %d, want 0", d)
	}
}

// Every fixture, with the headers and signature its sender really sent, is
// accepted or ignored, never refused.
func TestFixturesOverHTTP(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, nil)
	files, err := filepath.Glob("testdata/*/*.headers.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in testdata (%v)", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "testdata/"), ".headers.json")
		t.Run(name, func(t *testing.T) {
			body, h := readFixture(t, name)
			path := "/webhooks/" + strings.Split(name, "/")[0]
			code, out := g.do(t, http.MethodPost, path, h, body)
			if code != http.StatusOK && code != http.StatusAccepted {
				t.Errorf("answered %d %s", code, out)
			}
		})
	}
}

// SIGHUP reloads the registry; a bad file keeps the old one.
func TestReloadOnSIGHUP(t *testing.T) {
	e, g := newGateway(t, func(e *env) {
		e.writeRegistry("projects:\n  - key: other\n    gitea_repo: acme/other\n")
	})
	body, h := readFixture(t, "plane/issue__updated_labels")
	post := func() (int, string) {
		code, out := g.do(t, http.MethodPost, "/webhooks/plane", h, body)
		return code, string(out)
	}
	if code, out := post(); code != http.StatusOK || !strings.Contains(out, "unknown plane project") {
		t.Fatalf("before reload: %d %s", code, out)
	}
	e.writeRegistry(registryYAML)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if code, out := post(); code != http.StatusAccepted {
			return fmt.Errorf("after reload: %d %s", code, out)
		}
		return nil
	})
	e.writeRegistry("projects:\n  - key: Bad Key\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if m := g.metrics(t); !strings.Contains(m, `orch_gateway_registry_reloads_total{result="error"} 1`) {
			return fmt.Errorf("bad reload not counted:\n%s", grep(m, "reloads"))
		}
		return nil
	})
	if code, out := post(); code != http.StatusAccepted {
		t.Errorf("after a bad reload the old registry is gone: %d %s", code, out)
	}
}
