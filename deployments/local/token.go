package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/ui"
)

// TokenFileName is where `make run` keeps the API token it made, under
// ORCH_DATA_DIR, when ORCH_API_TOKEN is not set.
const TokenFileName = "api-token"

// tokenBytes is the randomness of a token make run makes: 64 hex
// characters, twice the gateway's minimum (gateway.APITokenMinLength).
const tokenBytes = 32

// ensureToken gives the gateway an API token: ORCH_API_TOKEN when set, or
// else the one in ORCH_DATA_DIR/api-token, made (random, mode 0600) on the
// first run. The gateway refuses every read of a job without one, so a
// local run without it could show nothing. It returns the file the token
// is in, or "" for one from the environment.
func ensureToken(gw *gateway.Config) (string, error) {
	if gw.APIToken != "" {
		return "", nil
	}
	path := filepath.Join(gw.DataDir, TokenFileName)
	data, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(data)) != "" {
		gw.APIToken = strings.TrimSpace(string(data))
		if n := len(gw.APIToken); n < gateway.APITokenMinLength {
			return "", fmt.Errorf("the API token in %s is %d characters, the gateway wants at least %d: delete the file, and make run makes a new one",
				path, n, gateway.APITokenMinLength)
		}
		return path, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b)
	gw.APIToken = hex.EncodeToString(b)
	if err := os.MkdirAll(gw.DataDir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(gw.APIToken+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("writing the API token: %w", err)
	}
	return path, nil
}

// printUsage tells the person at the terminal how to read the queue: a
// curl with the token's header. The token itself is not printed (it would
// end up in scrollback and logs); the command reads it from where it is.
func printUsage(w io.Writer, gw gateway.Config, tokenFile string) {
	fmt.Fprintf(w, "\norch is running. Send the sample webhook with `make sample`, then read the queue:\n"+
		"  curl -s -H \"Authorization: Bearer %s\" %s/queue\n"+
		"(every read of a job needs the token; webhooks, /healthz, /readyz and /metrics do not)\n\n",
		tokenHeader(tokenFile), localAddr(gw))
}

// loginLinkWait is how long printLoginLink waits between tries while the
// gateway cannot make a login link yet (it has not reached NATS).
const loginLinkWait = 200 * time.Millisecond

// printLoginLink prints a login link of the dashboard, single-use and good
// for ten minutes, once the gateway can make one: it asks the gateway as
// an operator would (POST /ui/login-links with the API token), and prints
// with it the curl that makes another. It returns when it has printed, or
// when ctx ends.
func printLoginLink(ctx context.Context, w io.Writer, gw gateway.Config, tokenFile string, log *zap.Logger) {
	more := fmt.Sprintf("curl -s -X POST -H \"Authorization: Bearer %s\" %s/ui/login-links", tokenHeader(tokenFile), localAddr(gw))
	link, err := makeLoginLink(ctx, gw)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("make run could not make a login link of the dashboard", zap.Error(err))
			fmt.Fprintf(w, "\nThe dashboard needs a login link; make one with:\n  %s\n\n", more)
		}
		return
	}
	fmt.Fprintf(w, "\nThe dashboard, through a login link that works once, within 10 minutes:\n  %s\n"+
		"Another link: %s\n\n", link, more)
}

// makeLoginLink asks the gateway for a login link, trying again while it
// answers 503 (NATS not reached yet) or does not answer (not listening
// yet).
func makeLoginLink(ctx context.Context, gw gateway.Config) (string, error) {
	if strings.HasSuffix(gw.HTTPAddr, ":0") {
		return "", errors.New("the gateway listens on a port chosen at start (ORCH_HTTP_ADDR ends in :0)")
	}
	base := "http://" + localAddr(gw)
	client := &http.Client{Timeout: 5 * time.Second}
	for {
		link, retry, err := askLoginLink(ctx, client, base, gw.APIToken)
		if err == nil || !retry {
			return link, err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(loginLinkWait):
		}
	}
}

// askLoginLink makes one POST /ui/login-links; retry says whether a
// failure may pass.
func askLoginLink(ctx context.Context, client *http.Client, base, token string) (link string, retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/ui/login-links", nil)
	if err != nil {
		return "", false, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return "", ctx.Err() == nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return "", resp.StatusCode == http.StatusServiceUnavailable, fmt.Errorf("POST /ui/login-links: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	var ans ui.LoginLink
	if err := json.Unmarshal(body, &ans); err != nil || ans.Link == "" {
		return "", false, fmt.Errorf("POST /ui/login-links answered %s", body)
	}
	if strings.HasPrefix(ans.Link, "/") { // no ORCH_PUBLIC_URL: a path on this gateway
		ans.Link = base + ans.Link
	}
	return ans.Link, false, nil
}

// tokenHeader is how a printed command names the token: read from its
// file, or from the environment.
func tokenHeader(tokenFile string) string {
	if tokenFile != "" {
		return "$(cat " + shortPath(tokenFile) + ")"
	}
	return `$ORCH_API_TOKEN`
}

// localAddr is where the gateway listens, as a person on this host types
// it: localhost:8080 for :8080.
func localAddr(gw gateway.Config) string {
	host, port, err := net.SplitHostPort(gw.HTTPAddr)
	if err != nil {
		host, port = "", "8080"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// shortPath is path relative to the working directory when it is below it.
func shortPath(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}
