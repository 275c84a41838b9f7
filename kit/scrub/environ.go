package scrub

import (
	"bufio"
	"bytes"
	"io"
	"net/url"
	"os"
	"strings"
)

// MinNamedSecret is the shortest value of a variable that FromEnviron
// takes for a secret by its name alone (API_KEY=..., X_TOKEN=...): a
// shorter one is more likely a setting than a credential.
const MinNamedSecret = 8

// maxSecretFile bounds what is read of a file named as holding a secret;
// a credential file is a few KiB at most.
const maxSecretFile = 64 << 10

// secretSuffixes end the names of variables that hold a secret.
var secretSuffixes = []string{"_TOKEN", "_KEY", "_SECRET", "_PASSWORD", "_PASSWD", "_SEED"}

// fileSuffixes end the names of variables that name a file of secrets
// (NATS's creds file) besides <secret name>_FILE.
var fileSuffixes = []string{"_CREDS"}

// FromEnviron returns the secrets an environment (os.Environ's
// "NAME=value" form) holds or points at:
//
//   - the value of every variable whose name ends in _TOKEN, _KEY,
//     _SECRET, _PASSWORD, _PASSWD or _SEED (ANTHROPIC_API_KEY,
//     CLAUDE_CODE_OAUTH_TOKEN, ORCH_NATS_PASSWORD, ...), when it is at least
//     MinNamedSecret long;
//   - the content of the file named by such a name with _FILE added
//     (ORCH_GITEA_TOKEN_FILE, ORCH_NATS_PASSWORD_FILE, ORCH_NATS_KEY_FILE,
//     ORCH_NATS_NKEY_SEED_FILE), or by a name ending in _CREDS
//     (ORCH_NATS_CREDS): the whole of a one-line file, each word-like line
//     of a longer one;
//   - the passwords in the git credential store file named by a variable
//     ending in _CREDENTIALS_FILE (ORCH_GIT_CREDENTIALS_FILE).
//
// A file that cannot be read adds nothing: a service that needs it says
// so where it reads it.
func FromEnviron(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || value == "" {
			continue
		}
		name = strings.ToUpper(name)
		switch {
		case strings.HasSuffix(name, "_CREDENTIALS_FILE"):
			out = append(out, GitCredentials(readSecretFile(value))...)
		case strings.HasSuffix(name, "_FILE") && secretName(strings.TrimSuffix(name, "_FILE")),
			hasSuffix(name, fileSuffixes):
			out = append(out, fileSecrets(readSecretFile(value))...)
		case secretName(name) && len(value) >= MinNamedSecret:
			out = append(out, value)
		}
	}
	return out
}

// secretName reports whether a variable of this name holds a secret
// (TOKEN itself as much as GITEA_TOKEN).
func secretName(name string) bool { return hasSuffix("_"+name, secretSuffixes) }

func hasSuffix(s string, suffixes []string) bool {
	for _, suf := range suffixes {
		if strings.HasSuffix(s, suf) {
			return true
		}
	}
	return false
}

func readSecretFile(path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	data, _ := io.ReadAll(io.LimitReader(f, maxSecretFile))
	return data
}

// fileSecrets are the secrets of a file's content: a one-line file (a
// token, a password) is one secret; in a longer one (a NATS creds file, a
// PEM key) each line without spaces that is not a "-----BEGIN ...-----"
// or "*****" banner is one.
func fileSecrets(data []byte) []string {
	text := strings.TrimSpace(string(data))
	if text == "" {
		return nil
	}
	if !strings.Contains(text, "\n") {
		return []string{text}
	}
	var out []string
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if len(line) >= MinNamedSecret && !strings.ContainsAny(line, " \t") &&
			!strings.HasPrefix(line, "---") && !strings.HasPrefix(line, "***") {
			out = append(out, line)
		}
	}
	return out
}

// GitCredentials returns the passwords (tokens) in a git credential store
// file, one URL a line (https://user:token@host), each as written and, if
// it is percent-encoded, decoded too.
func GitCredentials(data []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		u, err := url.Parse(line)
		if err != nil || u.User == nil {
			continue
		}
		pass, ok := u.User.Password()
		if !ok || pass == "" {
			continue
		}
		out = append(out, pass)
		// The raw form, as it appears in the file and in a URL an agent
		// prints from git's configuration.
		_, rest, _ := strings.Cut(line, "://")
		authority, _, _ := strings.Cut(rest, "/")
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			if _, raw, ok := strings.Cut(authority[:at], ":"); ok && raw != pass {
				out = append(out, raw)
			}
		}
	}
	return out
}
