package testkit

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
)

// GiteaHeaders are the headers Gitea sends with a JSON delivery of event
// whose body is body, signed with secret: X-Gitea-Signature is the
// lowercase hex HMAC-SHA256 of the body. It is worked out here, not with
// the gateway's own code, so that the tests check the gateway against
// Gitea's scheme. A test adds X-Gitea-Delivery where it matters.
func GiteaHeaders(secret, event string, body []byte) map[string]string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return map[string]string{
		"Content-Type":       "application/json",
		"X-Gitea-Event-Type": event,
		"X-Gitea-Signature":  hex.EncodeToString(mac.Sum(nil)),
	}
}

// Post sends body to url with headers (with http.DefaultClient when
// client is nil) and returns the answer's status code and body.
func Post(ctx context.Context, client *http.Client, url string, headers map[string]string, body []byte) (int, []byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}
