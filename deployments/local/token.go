package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/orch-dev/orch/services/gateway"
)

// TokenFileName is where `make run` keeps the API token it made, under
// ORCH_DATA_DIR, when ORCH_API_TOKEN is not set.
const TokenFileName = "api-token"

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
		return path, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	b := make([]byte, 24)
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
	token := `$ORCH_API_TOKEN`
	if tokenFile != "" {
		token = "$(cat " + shortPath(tokenFile) + ")"
	}
	addr := gw.HTTPAddr
	if strings.HasPrefix(addr, ":") {
		addr = "localhost" + addr
	}
	fmt.Fprintf(w, "\norch is running. Send the sample webhook with `make sample`, then read the queue:\n"+
		"  curl -s -H \"Authorization: Bearer %s\" %s/queue\n"+
		"(every read of a job needs the token; webhooks, /healthz, /readyz and /metrics do not)\n"+
		"The dashboard, through a one-time login link (it holds the token: keep it to yourself):\n"+
		"  %s\n\n", token, addr, dashboardLink(gw))
}

// dashboardLink is the one-time login link of the gateway's dashboard:
// under ORCH_PUBLIC_URL when set, else on this host's ORCH_HTTP_ADDR.
func dashboardLink(gw gateway.Config) string {
	base := strings.TrimRight(gw.PublicURL, "/")
	if base == "" {
		host, port, err := net.SplitHostPort(gw.HTTPAddr)
		if err != nil {
			host, port = "", "8080"
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "localhost"
		}
		base = "http://" + net.JoinHostPort(host, port)
	}
	return base + "/ui/login?token=" + url.QueryEscape(gw.APIToken)
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
