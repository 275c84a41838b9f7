// Package sample sends the sample Gitea pull request webhook of `make run`,
// signed as Gitea signs it, so that trying orch needs neither openssl nor a
// Gitea server.
package sample

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/gateway/webhook"
)

// PullRequest is the sample delivery: pull request #42 of acme/widgets
// opened, as Gitea 1.25 sends it.
//
//go:embed pull_request.json
var PullRequest []byte

// Event is the sample's X-Gitea-Event-Type (and X-Gitea-Event).
const Event = "pull_request"

// SecretDefault is the Gitea secret of `make run` when ORCH_GITEA_SECRET
// is not set.
const SecretDefault = "fixture-secret"

// URLFromAddr is the gateway's base URL for a listen address as
// ORCH_HTTP_ADDR spells it (":8080", "127.0.0.1:9090", or empty for the
// default).
func URLFromAddr(addr string) string {
	if addr == "" {
		addr = ":8080"
	}
	if strings.HasPrefix(addr, ":") {
		addr = "localhost" + addr
	}
	return "http://" + addr
}

// NewEvent returns body with the pull request's head moved to a random
// commit, as after a push: orch takes it for a new event, where the same
// body again is a repeat of the old one.
func NewEvent(body []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	pr, _ := m["pull_request"].(map[string]any)
	head, _ := pr["head"].(map[string]any)
	if head == nil {
		return nil, fmt.Errorf("the body has no pull_request.head")
	}
	head["sha"] = randomHex(20)
	return json.Marshal(m)
}

// Send posts body to the gateway at baseURL as Gitea would: the raw body
// signed with secret (X-Gitea-Signature, lowercase hex HMAC-SHA256, and
// X-Hub-Signature-256), the event type, and a fresh delivery id. It
// returns the answer's status code and body.
func Send(ctx context.Context, client *http.Client, baseURL, secret, event string, body []byte) (int, []byte, error) {
	sig := webhook.Sign(secret, body)
	return testkit.Post(ctx, client, strings.TrimRight(baseURL, "/")+"/webhooks/gitea", map[string]string{
		"Content-Type":           "application/json",
		webhook.GiteaEventType:   event,
		webhook.GiteaEventCoarse: event,
		webhook.GiteaDelivery:    uuid(),
		webhook.GiteaSignature:   sig,
		"X-Hub-Signature-256":    "sha256=" + sig,
	}, body)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// uuid is a random UUID, as Gitea's delivery ids are.
func uuid() string {
	h := randomHex(16)
	return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:]
}
