package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/gateway/throttle"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// A pull request whose title and body are easy to spot in any answer.
const (
	secretTitle = "Rotate the signing keys of customer-7731"
	secretBody  = "confidential: migration plan for customer-7731"
)

// queueSecretPR queues a review of a pull request with secretTitle and
// returns its job id.
func queueSecretPR(t *testing.T, g *gw) string {
	t.Helper()
	body := testkit.EditJSON(t, prBody(t, 91, "opened"), func(m map[string]any) {
		pr := m["pull_request"].(map[string]any)
		pr["title"], pr["body"] = secretTitle, secretBody
	})
	a, out := g.postGitea(t, body)
	if len(a.Jobs) != 1 {
		t.Fatalf("webhook: %s, want one job", out)
	}
	return a.Jobs[0].ID
}

// leaks names the job content found in an answer.
func leaks(body []byte, id string) []string {
	var found []string
	for _, s := range []string{secretTitle, "customer-7731", id, "pr-91"} {
		if bytes.Contains(body, []byte(s)) {
			found = append(found, s)
		}
	}
	return found
}

func TestReadsNeedTheToken(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	id := queueSecretPR(t, g)

	reads := []string{"/queue", "/queue?limit=1000", "/jobs/" + id, "/jobs/nope"}
	for _, path := range reads {
		for name, h := range map[string]map[string]string{
			"no header":            nil,
			"wrong token":          {"Authorization": "Bearer nope"},
			"token without Bearer": {"Authorization": apiToken},
			"basic auth":           {"Authorization": "Basic " + apiToken},
			"token as a prefix":    {"Authorization": "Bearer " + apiToken + "x"},
		} {
			code, body := g.do(t, http.MethodGet, path, h, nil)
			var ans map[string]any
			if code != http.StatusUnauthorized || json.Unmarshal(body, &ans) != nil || ans["error"] == nil {
				t.Errorf("GET %s, %s: %d %s, want 401 {\"error\": ...}", path, name, code, body)
			}
			if l := leaks(body, id); len(l) > 0 {
				t.Errorf("GET %s, %s: the answer shows %q", path, name, l)
			}
		}
		// Each wrong token counts against this client: let its failures
		// expire before the next path, so that none is answered 429.
		e.clock.advance(throttle.WindowDefault)
	}

	// With the token the job is there, title and all: the checks above
	// could have failed.
	if code, body := g.read(t, "/jobs/"+id); code != http.StatusOK || !bytes.Contains(body, []byte(secretTitle)) {
		t.Errorf("GET /jobs/%s with the token: %d %s", id, code, body)
	}
	if code, body := g.read(t, "/queue"); code != http.StatusOK || !bytes.Contains(body, []byte(id)) {
		t.Errorf("GET /queue with the token: %d %s", code, body)
	}
	if code, _ := g.do(t, http.MethodGet, "/jobs/"+id, map[string]string{"Authorization": "bearer " + apiToken}, nil); code != http.StatusOK {
		t.Errorf("the scheme is case-insensitive (RFC 9110), got %d", code)
	}

	// The open endpoints answer without a token and show no job.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		code, body := g.do(t, http.MethodGet, path, nil, nil)
		if code != http.StatusOK {
			t.Errorf("GET %s without a token: %d %s", path, code, body)
		}
		if l := leaks(body, id); len(l) > 0 {
			t.Errorf("GET %s shows %q", path, l)
		}
	}
}

// With no token configured nothing that shows or changes a job answers:
// the gateway must be reachable by the senders, so open reads would be
// open to anyone.
func TestPrivateEndpointsOffWithoutToken(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, func(e *env) { e.token = "" })
	id := queueSecretPR(t, g)
	for _, rq := range []struct{ method, path string }{
		{http.MethodGet, "/queue"}, {http.MethodGet, "/jobs/" + id},
		{http.MethodPost, "/jobs"}, {http.MethodPost, "/jobs/" + id + "/cancel"}, {http.MethodPost, "/jobs/" + id + "/retry"},
	} {
		for _, h := range []map[string]string{nil, {"Authorization": "Bearer "}, {"Authorization": "Bearer x"}} {
			code, body := g.do(t, rq.method, rq.path, h, []byte(`{}`))
			if code != http.StatusForbidden || !strings.Contains(string(body), "ORCH_API_TOKEN") {
				t.Errorf("%s %s, %v, no token configured: %d %s, want 403 naming ORCH_API_TOKEN", rq.method, rq.path, h, code, body)
			}
			if l := leaks(body, id); len(l) > 0 {
				t.Errorf("%s %s shows %q", rq.method, rq.path, l)
			}
		}
	}
}

// series lists the sample lines of a /metrics scrape without their values:
// one line per time series.
func series(t *testing.T, g *gw) []string {
	t.Helper()
	var out []string
	for l := range strings.SplitSeq(g.metrics(t), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, l[:strings.LastIndexByte(l, ' ')])
	}
	slices.Sort(out)
	return out
}

// randomEvent is an event header an attacker might send: known event
// names, near misses, long and odd strings.
func randomEvent(r *rand.Rand) string {
	known := []string{"pull_request", "issue_comment", "workflow_run", "issue", "push", "wiki", ""}
	switch r.IntN(4) {
	case 0:
		return known[r.IntN(len(known))]
	case 1:
		return known[r.IntN(len(known))] + fmt.Sprint(r.IntN(1000))
	default:
		const chars = "abcdefghijklmnopqrstuvwxyz_-.:/{}\"=ABC0123456789"
		b := make([]byte, 1+r.IntN(80))
		for i := range b {
			b[i] = chars[r.IntN(len(chars))]
		}
		return string(b)
	}
}

// sendRandom posts n webhooks with random event headers, built by kind, and
// fails the test if one is accepted.
func sendRandom(t *testing.T, g *gw, n int, kind func(i int, event string, h map[string]string) (path string, body []byte)) map[int]int {
	t.Helper()
	r := rand.New(rand.NewPCG(1, uint64(n)))
	codes := map[int]int{}
	for i := range n {
		event := randomEvent(r)
		h := map[string]string{"Content-Type": "application/json", webhook.GiteaDelivery: fmt.Sprint(i)}
		path, body := kind(i, event, h)
		code, out := g.do(t, http.MethodPost, path, h, body)
		codes[code]++
		if code == http.StatusAccepted {
			t.Fatalf("webhook %d (%q) was accepted: %s", i, event, out)
		}
	}
	return codes
}

// No webhook that is not genuine names a time series: 1,000 of them, with
// random event headers, unsigned or badly signed, for a known or an
// unknown project, leave /metrics with the same series.
func TestUnverifiedWebhooksAddNoSeries(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, nil)
	before := series(t, g)
	known := prBody(t, 5, "opened")
	unknownRepo := bytes.ReplaceAll(known, []byte("acme/widgets"), []byte("evil/elsewhere"))
	planeBody, planeH := readFixture(t, "plane/issue__updated_labels")
	codes := sendRandom(t, g, 1000, func(i int, event string, h map[string]string) (string, []byte) {
		switch i % 5 {
		case 0: // unsigned, an unknown project
			h[webhook.GiteaEventType] = event
			return "/webhooks/gitea", unknownRepo
		case 1: // signed with another secret
			h[webhook.GiteaEventType], h[webhook.GiteaSignature] = event, webhook.Sign("guess", known)
			return "/webhooks/gitea", known
		case 2: // a genuine signature of another body
			h[webhook.GiteaEventType], h[webhook.GiteaSignature] = event, webhook.Sign(giteaSecret, known)
			return "/webhooks/gitea", unknownRepo
		case 3: // Plane, badly signed
			h[webhook.PlaneEventHeader], h[webhook.PlaneSignature] = event, "00"+planeH[webhook.PlaneSignature]
			return "/webhooks/plane", planeBody
		default: // a random content type as well
			h["Content-Type"] = "text/" + strings.Trim(event, "\"{}/=:")
			h[webhook.PlaneEventHeader] = event
			return "/webhooks/plane", []byte(event)
		}
	})
	after := series(t, g)
	if !slices.Equal(before, after) {
		added := slices.DeleteFunc(slices.Clone(after), func(s string) bool { return slices.Contains(before, s) })
		t.Errorf("%d series before, %d after 1,000 unverified webhooks; new: %q", len(before), len(after), added)
	}
	if codes[http.StatusUnauthorized] < 500 {
		t.Errorf("answers %v: want most refused with 401", codes)
	}
	t.Logf("answers: %v; %d series", codes, len(after))

	// Genuine deliveries of an unknown project with random event headers:
	// only the sender's known events may appear as labels.
	sendRandom(t, g, 500, func(i int, event string, h map[string]string) (string, []byte) {
		h[webhook.GiteaEventType], h[webhook.GiteaSignature] = event, webhook.Sign(giteaSecret, unknownRepo)
		return "/webhooks/gitea", unknownRepo
	})
	for _, s := range series(t, g) {
		if slices.Contains(before, s) {
			continue
		}
		ok := false
		for _, e := range []string{"pull_request", "issue_comment", "workflow_run", "push", "wiki"} {
			ok = ok || strings.Contains(s, `event="`+e+`"`)
		}
		if !ok {
			t.Errorf("a signed delivery with a random event header added the series %s", s)
		}
	}
}

// A verified delivery names its event only when it is a known one.
func TestVerifiedWebhookLabels(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, nil)
	body := prBody(t, 8, "opened")
	for _, event := range []string{"wiki", "x-made-up", "pull_request"} {
		g.do(t, http.MethodPost, "/webhooks/gitea", giteaHeaders(event, body), body)
	}
	m := g.metrics(t)
	for _, want := range []string{
		`orch_gateway_webhooks_total{event="wiki",outcome="ignored",source="gitea"} 1`,
		`orch_gateway_webhooks_total{event="other",outcome="ignored",source="gitea"} 1`,
		`orch_gateway_webhooks_total{event="pull_request",outcome="queued",source="gitea"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(m, "webhooks_total"))
		}
	}
	if strings.Contains(m, "x-made-up") {
		t.Errorf("a made-up event names a series:\n%s", grep(m, "x-made-up"))
	}
}

// A repeated event answers with the same job, marked duplicate.
func TestRepeatedWebhookSaysDuplicate(t *testing.T) {
	t.Parallel()
	_, g := newGateway(t, nil)
	body := prBody(t, 12, "opened")
	a1, first := g.postGitea(t, body)
	if bytes.Contains(first, []byte(`"duplicate"`)) {
		t.Errorf("first delivery answered %s, want no duplicate", first)
	}
	if len(a1.Jobs) != 1 {
		t.Fatalf("first delivery answered %s, want one job", first)
	}
	// On a loaded machine the first delivery may have been spooled (the
	// publish timed out); the job exists once the spool has drained.
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if code, out := g.read(t, "/jobs/"+a1.Jobs[0].ID); code != http.StatusOK {
			return fmt.Errorf("GET /jobs/%s: %d %s", a1.Jobs[0].ID, code, out)
		}
		return nil
	})
	a2, second := g.postGitea(t, body)
	if len(a2.Jobs) != 1 || a2.Jobs[0].ID != a1.Jobs[0].ID || !a2.Jobs[0].Duplicate {
		t.Errorf("repeated delivery answered %s, want the job of %s with \"duplicate\": true", second, first)
	}
}
