// Package scrub removes secrets from text that leaves a service for people
// to read: an agent's final message and error text in the status record,
// a tracking comment, a log tail. The agent runs commands on a runner that
// holds credentials, and whatever it prints may quote them; every service
// that shows such text passes it through one Scrubber, so that one set of
// rules decides what counts as a secret.
package scrub

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
)

// Redacted replaces every secret and credential value.
const Redacted = "[redacted]"

// MinSecret is the shortest literal secret a Scrubber replaces: shorter
// values would blot out ordinary words.
const MinSecret = 4

// Scrubber replaces secrets in text. Its zero value replaces only what
// looks like a credential.
type Scrubber struct {
	// Secrets are literal values replaced wherever they appear; those
	// shorter than MinSecret are left alone.
	Secrets []string
}

var (
	// credential matches "token=...", "password: ...", "api_key=..." and
	// the like, keeping the name and hiding the value.
	credential = regexp.MustCompile(`(?i)\b([a-z0-9_]*(?:token|secret|password|passwd|api[_-]?key|credentials?)[a-z0-9_]*)(\s*[:=]\s*)("[^"]*"|'[^']*'|\S+)`)
	// bearer matches an Authorization header's value.
	bearer = regexp.MustCompile(`(?i)\b(bearer|token|basic)\s+[A-Za-z0-9._~+/=-]{16,}`)
	// userinfo matches the password of a URL such as
	// https://user:token@host, the form of a git credential.
	userinfo = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*):[^\s/@]+@`)
	// keyShape matches the credentials that announce themselves: model
	// API keys, GitHub tokens, private key blocks.
	keyShape = regexp.MustCompile(`\bsk-ant-[A-Za-z0-9_-]{16,}|\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\z)`)
	// absPath matches an absolute path that does not follow a URL's
	// host, so https://host/a/b is left alone.
	absPath = regexp.MustCompile(`(^|[\s'"(=,\[])(/[^\s'"():,\]]+/)([^\s'"():,\]/]*)`)
)

// Credentials returns s with every secret and every value that looks like
// a credential replaced by Redacted. Longer secrets go first, so that a
// secret that holds a shorter one is replaced whole.
func (sc Scrubber) Credentials(s string) string {
	secrets := slices.Clone(sc.Secrets)
	slices.SortFunc(secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, secret := range secrets {
		if len(secret) >= MinSecret {
			s = strings.ReplaceAll(s, secret, Redacted)
		}
	}
	s = keyShape.ReplaceAllString(s, Redacted)
	s = userinfo.ReplaceAllString(s, "$1:"+Redacted+"@")
	s = credential.ReplaceAllString(s, "$1$2"+Redacted)
	return bearer.ReplaceAllString(s, "$1 "+Redacted)
}

// Scrub returns s with its credentials replaced (see Credentials) and its
// absolute paths cut to their last element, as a comment on a tracker
// shows it: paths on a runner's disk are nobody else's business.
// workspace, when known, is the runner's workspace root, which is cut from
// paths first.
func (sc Scrubber) Scrub(s, workspace string) string {
	s = sc.Credentials(s)
	if workspace != "" && workspace != "/" {
		s = strings.ReplaceAll(s, strings.TrimRight(workspace, "/")+"/", "")
	}
	return absPath.ReplaceAllString(s, "$1…/$3")
}
