package service

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// Secret is a setting that must never reach a log: it prints as
// "[redacted]" however it is formatted.
type Secret string

// String redacts the secret.
func (Secret) String() string { return "[redacted]" }

// GoString redacts the secret for %#v.
func (Secret) GoString() string { return `"[redacted]"` }

// MarshalText redacts the secret in JSON and zap's reflection encoding.
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// ReadSecretFile reads a secret from the file an ORCH_*_FILE variable
// names, without its surrounding white space (a trailing newline). The
// error names the variable and the file, never the content.
func ReadSecretFile(variable, path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", variable, err)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", variable, path)
	}
	return s, nil
}

// natsAuth checks the NATS login and TLS settings and returns the options
// that apply them. One way to log in at most: a user and password, an
// nkey seed, or a credentials file; a user needs its password, a client
// certificate its key.
func (c *Common) natsAuth() ([]nats.Option, error) {
	var errs []error
	var logins []string
	password := string(c.NATSPassword)
	switch {
	case password != "" && c.NATSPasswordFile != "":
		errs = append(errs, errors.New("ORCH_NATS_PASSWORD and ORCH_NATS_PASSWORD_FILE: set one, not both"))
	case c.NATSPasswordFile != "":
		var err error
		if password, err = ReadSecretFile(EnvPrefix+"NATS_PASSWORD_FILE", c.NATSPasswordFile); err != nil {
			errs = append(errs, err)
		}
	}
	if c.NATSUser != "" || c.NATSPassword != "" || c.NATSPasswordFile != "" {
		logins = append(logins, "ORCH_NATS_USER")
		if c.NATSUser == "" {
			errs = append(errs, errors.New("ORCH_NATS_PASSWORD (or _FILE) needs ORCH_NATS_USER"))
		} else if c.NATSPassword == "" && c.NATSPasswordFile == "" {
			errs = append(errs, fmt.Errorf("ORCH_NATS_USER %q needs ORCH_NATS_PASSWORD or ORCH_NATS_PASSWORD_FILE", c.NATSUser))
		}
	}
	if c.NATSNKeySeedFile != "" {
		logins = append(logins, "ORCH_NATS_NKEY_SEED_FILE")
	}
	if c.NATSCreds != "" {
		logins = append(logins, "ORCH_NATS_CREDS")
	}
	if len(logins) > 1 {
		errs = append(errs, fmt.Errorf("%s: set one way to log in to NATS, not %d", strings.Join(logins, ", "), len(logins)))
	}
	if (c.NATSCertFile == "") != (c.NATSKeyFile == "") {
		errs = append(errs, errors.New("ORCH_NATS_CERT_FILE and ORCH_NATS_KEY_FILE go together"))
	}
	var opts []nats.Option
	if c.NATSUser != "" && password != "" {
		opts = append(opts, nats.UserInfo(c.NATSUser, password))
	}
	if c.NATSNKeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(c.NATSNKeySeedFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("ORCH_NATS_NKEY_SEED_FILE: %w", err))
		}
		opts = append(opts, opt)
	}
	if c.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	}
	if c.NATSCAFile != "" {
		opts = append(opts, nats.RootCAs(c.NATSCAFile))
	}
	if c.NATSCertFile != "" && c.NATSKeyFile != "" {
		opts = append(opts, nats.ClientCert(c.NATSCertFile, c.NATSKeyFile))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return opts, nil
}
