package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/proto"
)

// TestAPI's subtests share one gateway, for speed, and nothing else: each
// makes the jobs it reads or acts on, so each passes alone (-run
// 'TestAPI/cancel') and in any order.
func TestAPI(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	auth := map[string]string{"Authorization": "Bearer " + apiToken, "Content-Type": "application/json"}
	// enqueue queues a job by hand under its own key and returns its id.
	enqueue := func(t *testing.T, key string) string {
		t.Helper()
		req := []byte(`{"project":"widgets","kind":"implement","task":{"id":"WID-` + key + `","title":"By hand"},"key":"` + key + `"}`)
		code, body := g.do(t, http.MethodPost, "/jobs", auth, req)
		var a accepted
		if err := json.Unmarshal(body, &a); err != nil || code != http.StatusAccepted || len(a.Jobs) != 1 {
			t.Fatalf("POST /jobs: %d %s", code, body)
		}
		return a.Jobs[0].ID
	}

	t.Run("write endpoints need the token", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"/jobs", "/jobs/abc/cancel", "/jobs/abc/retry"} {
			if code, body := g.do(t, http.MethodPost, path, nil, []byte(`{}`)); code != http.StatusUnauthorized {
				t.Errorf("POST %s without token: %d %s", path, code, body)
			}
			if code, _ := g.do(t, http.MethodPost, path, map[string]string{"Authorization": "Bearer nope"}, nil); code != http.StatusUnauthorized {
				t.Errorf("POST %s with a wrong token: %d", path, code)
			}
		}
	})

	t.Run("enqueue by hand", func(t *testing.T) {
		t.Parallel()
		req := []byte(`{"project":"widgets","kind":"implement","task":{"id":"WID-9","title":"By hand"},"key":"k1"}`)
		code, body := g.do(t, http.MethodPost, "/jobs", auth, req)
		if code != http.StatusAccepted {
			t.Fatalf("POST /jobs: %d %s", code, body)
		}
		var a accepted
		_ = json.Unmarshal(body, &a)
		if len(a.Jobs) != 1 || a.Jobs[0].Task != "wid-9" || a.Jobs[0].Kind != "implement" {
			t.Fatalf("POST /jobs answer %s", body)
		}
		manual := a.Jobs[0].ID
		if _, again := g.do(t, http.MethodPost, "/jobs", auth, req); !strings.Contains(string(again), manual) {
			t.Errorf("the same key named another job: %s", again)
		}
		for _, bad := range []string{`{"project":"nope","kind":"fix","task":{"id":"x"}}`, `{"project":"widgets","kind":"dance","task":{"id":"x"}}`, `{"project":"widgets","kind":"fix","task":{}}`, `{`} {
			if code, body := g.do(t, http.MethodPost, "/jobs", auth, []byte(bad)); code != http.StatusBadRequest {
				t.Errorf("POST /jobs %s: %d %s", bad, code, body)
			}
		}
	})

	t.Run("get a job", func(t *testing.T) {
		t.Parallel()
		manual := enqueue(t, "get")
		code, body := g.read(t, "/jobs/"+manual)
		var ans struct {
			Job    proto.Job    `json:"job"`
			Status proto.Status `json:"status"`
		}
		if err := json.Unmarshal(body, &ans); err != nil || code != 200 || ans.Job.ID != manual || ans.Status.State != proto.StateQueued || !ans.Job.Source.Trusted {
			t.Errorf("GET /jobs/%s: %d %s", manual, code, body)
		}
		if code, _ := g.read(t, "/jobs/nope"); code != http.StatusNotFound {
			t.Errorf("unknown job: %d", code)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		manual := enqueue(t, "cancel")
		code, body := g.do(t, http.MethodPost, "/jobs/"+manual+"/cancel", auth, nil)
		if code != http.StatusOK || !strings.Contains(string(body), `"cancelled"`) {
			t.Errorf("cancel: %d %s", code, body)
		}
		if code, body := g.do(t, http.MethodPost, "/jobs/"+manual+"/cancel", auth, nil); code != http.StatusConflict {
			t.Errorf("second cancel: %d %s", code, body)
		}
		if code, _ := g.do(t, http.MethodPost, "/jobs/nope/cancel", auth, nil); code != http.StatusNotFound {
			t.Errorf("cancel unknown: %d", code)
		}
	})

	t.Run("retry a dead letter", func(t *testing.T) {
		t.Parallel()
		manual := enqueue(t, "alive")
		if code, body := g.do(t, http.MethodPost, "/jobs/"+manual+"/retry", auth, nil); code != http.StatusConflict {
			t.Errorf("retry of a job not dead-lettered: %d %s", code, body)
		}
		// Dead-letter a job as the notifier does.
		_, js, kv := natstest.Connect(t, e.srv)
		ctx := context.Background()
		dead := proto.Job{Schema: 1, ID: proto.JobID("dead"), Kind: proto.KindFix, Project: "widgets", Task: proto.Task{ID: "wid-3"}}
		data, _ := json.Marshal(dead)
		ack, err := js.Publish(ctx, proto.DLQSubject("widgets", proto.KindFix), data)
		if err != nil {
			t.Fatal(err)
		}
		statustest.Set(t, status.New(kv), &dead, func(s *proto.Status) {
			s.State, s.DLQSeq = proto.StateFailed, ack.Sequence
		})
		code, body := g.do(t, http.MethodPost, "/jobs/"+dead.ID+"/retry", auth, nil)
		var a accepted
		_ = json.Unmarshal(body, &a)
		if code != http.StatusAccepted || len(a.Jobs) != 1 || a.Jobs[0].ID == dead.ID {
			t.Fatalf("retry: %d %s", code, body)
		}
		var ans struct {
			Job proto.Job `json:"job"`
		}
		_, body = g.read(t, "/jobs/"+a.Jobs[0].ID)
		if err := json.Unmarshal(body, &ans); err != nil || ans.Job.RetryOf != dead.ID || ans.Job.Task.ID != "wid-3" {
			t.Errorf("retried job: %s", body)
		}
		if _, again := g.do(t, http.MethodPost, "/jobs/"+dead.ID+"/retry", auth, nil); !strings.Contains(string(again), a.Jobs[0].ID) {
			t.Errorf("second retry of the same dead letter named another job: %s", again)
		}
	})

	t.Run("closing a pull request cancels its task and queues a cleanup", func(t *testing.T) {
		t.Parallel()
		opened := g.postPR(t, 77, "opened")
		review := opened.Jobs[0].ID
		natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
			for _, r := range g.queue(t).Recent {
				if r.ID == review {
					return nil
				}
			}
			return fmt.Errorf("job %s not in the index yet", review)
		})
		closed := g.postPR(t, 77, "closed")
		if closed.Cancel == nil || closed.Cancel.Task != "pr-77" || len(closed.Jobs) != 1 || closed.Jobs[0].Kind != "cleanup" {
			t.Fatalf("close answer %+v", closed)
		}
		var ans struct {
			Status proto.Status `json:"status"`
		}
		_, body := g.read(t, "/jobs/"+review)
		if err := json.Unmarshal(body, &ans); err != nil || ans.Status.State != proto.StateCancelled {
			t.Errorf("review job after close: %s", body)
		}
	})

	t.Run("queue figures", func(t *testing.T) {
		t.Parallel()
		manual := enqueue(t, "figures")
		var q queueAnswer
		natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
			q = g.queue(t)
			for _, r := range q.Recent {
				if r.ID == manual {
					return nil
				}
			}
			return fmt.Errorf("job %s not among the recent jobs yet", manual)
		})
		if q.Stream == nil || q.Consumer != nil && q.Consumer.Pending > q.Stream.Messages {
			t.Errorf("stream figures %+v", q)
		}
		for _, s := range proto.States {
			if _, ok := q.Counts[string(s)]; !ok {
				t.Errorf("counts lack %s: %v", s, q.Counts)
			}
		}
		if len(q.Recent) == 0 || q.Recent[0].UpdatedAt.IsZero() {
			t.Errorf("recent %+v", q.Recent)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		t.Parallel()
		g.postPR(t, 78, "opened")
		body := g.metrics(t)
		for _, want := range []string{
			`orch_gateway_webhooks_total{event="pull_request",outcome="queued",source="gitea"}`,
			`orch_gateway_publish_seconds_count`,
			`orch_gateway_spool_depth 0`,
			`orch_jobs{state="cancelled"}`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("request id", func(t *testing.T) {
		t.Parallel()
		req, _ := http.NewRequest(http.MethodGet, g.url+"/healthz", nil)
		req.Header.Set("X-Request-Id", "abc-123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Request-Id"); got != "abc-123" {
			t.Errorf("request id %q, want abc-123", got)
		}
		resp, err = http.Get(g.url + "/nowhere")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 || len(resp.Header.Get("X-Request-Id")) < 16 {
			t.Errorf("404 answer: %d, request id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
		}
	})
}
