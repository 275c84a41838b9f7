// Package webhook verifies and parses the deliveries of Gitea and Plane.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// ErrSignature is returned for a missing, empty or wrong signature.
var ErrSignature = errors.New("bad or missing signature")

// Verify checks that sig is the lowercase or uppercase hex HMAC-SHA256 of
// body under secret, in constant time. A "sha256=" prefix, as in
// X-Hub-Signature-256, is accepted. An empty secret verifies nothing.
func Verify(secret string, body []byte, sig string) error {
	sig = strings.TrimPrefix(strings.TrimSpace(sig), "sha256=")
	if secret == "" || sig == "" {
		return ErrSignature
	}
	// Both sums live on the stack: a delivery costs no allocation here
	// beyond the HMAC itself.
	var (
		hexSig    [2 * sha256.Size]byte
		got, want [sha256.Size]byte
	)
	if len(sig) != len(hexSig) {
		return ErrSignature
	}
	copy(hexSig[:], sig)
	if _, err := hex.Decode(got[:], hexSig[:]); err != nil {
		return ErrSignature
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	if !hmac.Equal(got[:], mac.Sum(want[:0])) {
		return ErrSignature
	}
	return nil
}

// Sign returns the hex HMAC-SHA256 of body under secret, as Gitea and
// Plane send it.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}
