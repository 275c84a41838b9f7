// Package gitea makes signed Gitea pull-request deliveries, as Gitea sends
// them, each one a distinct event (a distinct head commit) so that each
// queues its own job.
package gitea

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Secret is the Gitea signing secret the bench and the soak configure.
const Secret = "fixture-secret"

// Repo is the repository of every delivery (repository.full_name).
const Repo = "acme/widgets"

// payload is a real-shaped "pull_request opened" delivery of Repo.
//
//go:embed pull_request.json
var payload []byte

// Delivery is one webhook, ready to send.
type Delivery struct {
	Body      []byte
	Signature string
}

// PR describes the pull request of a delivery. Its task is agent/<Branch
// minus the prefix> for an agent branch, else pr-<Number>; Seq makes the
// head commit, and so the job, unique.
type PR struct {
	Number int
	Branch string
	Seq    int
	// HeadSHA is the head commit the delivery names; empty names a
	// made-up commit derived from Seq, which no repository has.
	HeadSHA string
	// Repo is the repository's owner/name; empty means Repo.
	Repo string
}

// New returns a signed "opened" delivery of pr.
func New(pr PR) (Delivery, error) {
	var p map[string]any
	if err := json.Unmarshal(payload, &p); err != nil {
		return Delivery{}, fmt.Errorf("fixture: %w", err)
	}
	p["number"] = pr.Number
	req, ok := p["pull_request"].(map[string]any)
	if !ok {
		return Delivery{}, fmt.Errorf("fixture has no pull_request")
	}
	req["number"] = pr.Number
	req["title"] = "bench pull request " + strconv.Itoa(pr.Seq)
	head := req["head"].(map[string]any)
	sum := sha256.Sum256([]byte("bench-" + strconv.Itoa(pr.Seq)))
	head["sha"] = hex.EncodeToString(sum[:20])
	if pr.HeadSHA != "" {
		head["sha"] = pr.HeadSHA
	}
	if pr.Branch != "" {
		head["ref"], head["label"] = pr.Branch, pr.Branch
	}
	if pr.Repo != "" {
		repo, ok := p["repository"].(map[string]any)
		if !ok {
			return Delivery{}, fmt.Errorf("fixture has no repository")
		}
		owner, name, _ := strings.Cut(pr.Repo, "/")
		repo["full_name"], repo["name"] = pr.Repo, name
		if o, ok := repo["owner"].(map[string]any); ok {
			o["login"], o["username"] = owner, owner
		}
	}
	body, err := json.Marshal(p)
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{Body: body, Signature: Sign(Secret, body)}, nil
}

// Sign is the hex HMAC-SHA256 of body under secret.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// Request builds the POST of d to the gateway at base.
func (d Delivery) Request(base string, seq int) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/webhooks/gitea", bytes.NewReader(d.Body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gitea-Event", "pull_request")
	req.Header.Set("X-Gitea-Event-Type", "pull_request")
	req.Header.Set("X-Gitea-Delivery", "bench-"+strconv.Itoa(seq))
	req.Header.Set("X-Gitea-Signature", d.Signature)
	req.Header.Set("X-Hub-Signature-256", "sha256="+d.Signature)
	return req, nil
}

// Accepted is the body of a 202 answer.
type Accepted struct {
	Jobs []struct {
		ID   string `json:"id"`
		Task string `json:"task"`
	} `json:"jobs"`
	Spooled bool `json:"spooled"`
}
