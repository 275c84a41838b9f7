package runner_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// An agent that prints the runner's model key and git credential in its
// final message, or in the error it reports, and a megabyte besides: the
// status record, which the notifier posts to the tracker for anyone to
// read, holds neither secret, not even a piece of one cut in half, and
// holds at most a bounded text that says it was cut. Neither value has a
// shape a pattern would know: they are found because the runner holds
// them (ANTHROPIC_API_KEY, ORCH_GIT_CREDENTIALS_FILE).
func TestAgentTextHoldsNoRunnerSecret(t *testing.T) {
	const (
		modelKey = "runner-model-key-7d3f9a1c2b4e5f60"
		gitToken = "gitea-pat-5f1c0d6b8e2a4c7f9b3d"
	)
	t.Setenv("ANTHROPIC_API_KEY", modelKey)
	creds := filepath.Join(t.TempDir(), "git-credentials")
	if err := os.WriteFile(creds, []byte("https://orch-bot:"+gitToken+"@git.example.com\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ORCH_GIT_CREDENTIALS_FILE", creds)

	e := newEnv(t, "")
	// The stand-in for Claude Code reads the key from its environment and
	// the credential from the runner's disk, as an unconfined agent can.
	// The key comes twice: early, and across the point where a 4 KiB text
	// would be cut.
	body := fmt.Sprintf(`cred=$(cat %q)
token=${cred#*orch-bot:}; token=${token%%@*}
pad=$(head -c 4070 /dev/zero | tr '\0' y)
big=$(head -c 1048576 /dev/zero | tr '\0' x)
text="Done. The key is $ANTHROPIC_API_KEY; I pushed with $cred/acme/widgets.git (token $token). $pad$ANTHROPIC_API_KEY $big"
error=false; [ "$ORCH_TASK" = task-error ] && error=true
printf '{"type":"result","subtype":"success","is_error":%%s,"num_turns":1,"total_cost_usd":0.01,"session_id":"s1","result":"%%s"}\n' "$error" "$text"
`, creds)
	agentCmd := testkit.Script(t, filepath.Join(e.dir, "bin", "claude"), body) + " -p --output-format stream-json --verbose"
	cfg := e.config("r1", agentCmd)
	cfg.MaxAttempts = 1
	// Unconfined, as the stand-in says: a confined agent never holds
	// the key or the credential (TestHostileAgentConfined).
	cfg.AgentSandbox = sandbox.ModeNone
	e.start(cfg)

	done := job("secret-result", "task-result", proto.KindImplement)
	failed := job("secret-error", "task-error", proto.KindImplement)
	e.enqueue(done)
	e.enqueue(failed)
	result := e.waitState(done.ID, proto.StateDone, 60*time.Second).Result
	errText := e.waitState(failed.ID, proto.StateFailed, 60*time.Second).Error

	for _, tc := range []struct {
		name, text, says string
		max              int
	}{
		{"final message", result, "orch cut the agent's final message here: it had 1052", 4096},
		// Claude Code's error text comes cut to 1 KiB already, after
		// the first key.
		{"error text", errText, "", 4096},
	} {
		for _, secret := range []string{modelKey, gitToken} {
			for i := 0; i+12 <= len(secret); i++ {
				if piece := secret[i : i+12]; strings.Contains(tc.text, piece) {
					t.Errorf("%s holds %q, a piece of a secret:\n%.300s", tc.name, piece, tc.text)
					break
				}
			}
		}
		if len(tc.text) > tc.max || !strings.Contains(tc.text, tc.says) {
			t.Errorf("%s is %d bytes ending %q; want at most %d, saying %q", tc.name, len(tc.text), tc.text[max(len(tc.text)-200, 0):], tc.max, tc.says)
		}
		if !strings.Contains(tc.text, "Done. The key is [redacted]; I pushed with https://orch-bot:[redacted]@git.example.com/acme/widgets.git (token [redacted]).") {
			t.Errorf("%s does not keep the agent's words around the secrets:\n%.300s", tc.name, tc.text)
		}
	}
}
