package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/service"
)

// natsDir is where `make run` keeps its NATS logins, under ORCH_DATA_DIR:
// one password file per user (<user>.password) and the nats CLI's
// context (contextFile), each readable by their owner only.
const natsDir = "nats"

// contextFile is the nats CLI context `make run` writes: the admin user,
// where ORCH_NATS_URL points. The README has the CLI read it through
// NATS_CONTEXT.
const contextFile = "context.json"

// natsPasswords returns a password for every user of the table, kept in
// dir/<user>.password (mode 0600): made at the first run, read at the
// next, so a store made by one run opens with the same logins.
func natsPasswords(dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("NATS logins: %w", err)
	}
	pw := map[string]string{}
	for _, user := range natsauth.Users() {
		path := filepath.Join(dir, user+".password")
		s, err := service.ReadSecretFile("the NATS password of "+user, path)
		if errors.Is(err, fs.ErrNotExist) {
			b := make([]byte, 24)
			_, _ = rand.Read(b) // never fails (crypto/rand)
			s = base64.RawURLEncoding.EncodeToString(b)
			err = os.WriteFile(path, []byte(s+"\n"), 0o600)
		}
		if err != nil {
			return nil, fmt.Errorf("NATS logins: %w", err)
		}
		pw[user] = s
	}
	return pw, nil
}

// natsLogin makes c log in as user. `make run` runs its own server with
// its own users, so a login given in the environment would not be one of
// them: it is refused with a message, not silently replaced.
func natsLogin(c *service.Common, user string, pw map[string]string) error {
	for _, set := range []struct {
		name string
		set  bool
	}{
		{"ORCH_NATS_USER", c.NATSUser != ""}, {"ORCH_NATS_PASSWORD", c.NATSPassword != ""},
		{"ORCH_NATS_PASSWORD_FILE", c.NATSPasswordFile != ""}, {"ORCH_NATS_CREDS", c.NATSCreds != ""},
		{"ORCH_NATS_NKEY_SEED_FILE", c.NATSNKeySeedFile != ""},
	} {
		if set.set {
			return fmt.Errorf("%s: make run logs every service in to its own embedded NATS server as its own user (see %s); unset it",
				set.name, filepath.Join(c.DataDir, natsDir))
		}
	}
	c.NATSUser, c.NATSPassword = user, service.Secret(pw[user])
	return nil
}

// writeNATSContext writes the nats CLI context of the admin user, for
// the server at url, to path (mode 0600).
func writeNATSContext(path, url string, pw map[string]string) error {
	ctx := map[string]string{
		"description": "orch make run: the admin user of the embedded server",
		// The CLI takes one URL or several, comma-separated, as orch does.
		"url":      strings.TrimSpace(url),
		"user":     natsauth.Admin,
		"password": pw[natsauth.Admin],
	}
	data, err := json.MarshalIndent(ctx, "", "  ")
	if err != nil {
		return err
	}
	// WriteFile keeps the mode of a file that exists: make it private first.
	if err := os.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the nats CLI context: %w", err)
	}
	return os.Chmod(path, 0o600)
}
