package runner

import (
	"fmt"
	"os"
	"reflect"
	"unicode/utf8"

	"github.com/orch-dev/orch/kit/scrub"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/services/runner/agent"
)

// What of an agent's own words the status record keeps. The record is a
// KV value that the dashboard shows and the notifier posts to the tracker
// as the tracking comment, where anyone who can read the pull request or
// work item reads it; the agent wrote those words on a host that holds
// the runner's credentials, and may have been steered by text a stranger
// wrote. So both texts are scrubbed here, before anything else sees them,
// of the runner's secrets (scrub.FromEnviron over the runner's
// environment and configuration) and of whatever looks like a
// credential, and cut to a bound with a marker that says so. The whole
// text stays in the attempt's log.
const (
	// resultMax bounds the agent's final message: the notifier shows
	// about as much of it in a comment.
	resultMax = agent.ResultTextMax
	// errorMax bounds the error text, which may quote the agent's output.
	errorMax = 4 << 10
	// scrubSlack is how far past a bound a text is scrubbed before it is
	// cut, so that a secret that starts before the cut is seen whole and
	// no prefix of it is kept.
	scrubSlack = 64 << 10
)

// shown scrubs and bounds the agent's text in o: its final message and
// its error.
func (r *Runner) shown(o *status.Outcome) {
	sc := scrub.Scrubber{Secrets: r.secrets()}
	o.Result = scrubbed(sc, o.Result, resultMax, "agent's final message")
	o.Err = scrubbed(sc, o.Err, errorMax, "error text")
}

// secrets are the values no text the runner records may show: those of
// its environment and of its configuration (a Config built in Go, as
// `make run` builds one, need not be in the environment). They are read
// at each settle, so a credential file rotated in place is honoured.
func (r *Runner) secrets() []string {
	return scrub.FromEnviron(append(os.Environ(), configEnviron(r.cfg)...))
}

// configEnviron is cfg's string settings as the environment would hold
// them ("NATS_PASSWORD=...", by their env tags, without the ORCH_ prefix,
// which scrub.FromEnviron does not need).
func configEnviron(cfg Config) []string {
	var out []string
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			f, fv := v.Type().Field(i), v.Field(i)
			switch {
			case f.Anonymous && fv.Kind() == reflect.Struct:
				walk(fv)
			case f.IsExported() && fv.Kind() == reflect.String && f.Tag.Get("env") != "" && f.Tag.Get("env") != "-":
				out = append(out, f.Tag.Get("env")+"="+fv.String())
			}
		}
	}
	walk(reflect.ValueOf(cfg))
	return out
}

// scrubbed is s scrubbed by sc and cut to at most n bytes, at a character
// boundary, ending in a marker that says what was cut and how long it
// was.
func scrubbed(sc scrub.Scrubber, s string, n int, what string) string {
	total := len(s)
	if total > n+scrubSlack {
		s = s[:runeStart(s, n+scrubSlack)]
	}
	s = sc.Credentials(s)
	if len(s) <= n {
		return s
	}
	mark := fmt.Sprintf("\n\n[… orch cut the %s here: it had %d bytes, more than the %d kept; the attempt's log has all of it]", what, total, n)
	return s[:runeStart(s, max(n-len(mark), 0))] + mark
}

// runeStart is the greatest i <= n at which a character of s starts.
func runeStart(s string, n int) int {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
