package scrub_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/scrub"
)

func TestScrub(t *testing.T) {
	sc := scrub.Scrubber{Secrets: []string{"s3cr3t-value", "s3cr3t-value-longer", "abc"}}
	for _, tc := range []struct{ in, ws, want string }{
		{"push failed: s3cr3t-value", "", "push failed: [redacted]"},
		{"the longer s3cr3t-value-longer goes whole", "", "the longer [redacted] goes whole"},
		{"abc is too short to be a secret", "", "abc is too short to be a secret"},
		{"GITEA_TOKEN=abc123 and password: hunter2", "", "GITEA_TOKEN=[redacted] and password: [redacted]"},
		{"Authorization: Bearer abcdefghijklmnopqrstuv", "", "Authorization: Bearer [redacted]"},
		{"FAIL /srv/orch/ws/worktrees/acme/t1/a_test.go:3", "/srv/orch/ws", "FAIL worktrees/acme/t1/a_test.go:3"},
		{"open /home/runner/.cache/x.json: denied", "", "open …/x.json: denied"},
		{"see https://git.example.com/acme/api/pulls/3", "", "see https://git.example.com/acme/api/pulls/3"},
		{"fetch https://orch:9f8e7d6c5b4a@git.example.com/acme/api.git failed", "", "fetch https://orch:[redacted]@git.example.com/acme/api.git failed"},
		{"key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv-wx end", "", "key [redacted] end"},
		{"gh ghp_0123456789abcdefghijABCDEFGHIJ end", "", "gh [redacted] end"},
		{"x\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\ny", "", "x\n[redacted]\ny"},
	} {
		if got := sc.Scrub(tc.in, tc.ws); got != tc.want {
			t.Errorf("Scrub(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Credentials leaves paths alone: the status record keeps them for the
// operator, only a tracker comment cuts them.
func TestCredentialsKeepsPaths(t *testing.T) {
	sc := scrub.Scrubber{Secrets: []string{"s3cr3t-value"}}
	in := "open /srv/orch/ws/a.go with s3cr3t-value"
	if got, want := sc.Credentials(in), "open /srv/orch/ws/a.go with [redacted]"; got != want {
		t.Errorf("Credentials(%q) = %q, want %q", in, got, want)
	}
}

func TestFromEnviron(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	creds := write("nats.creds", "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5In0.eyJqdGkiOiJ\n------END NATS USER JWT------\n\n************************* IMPORTANT *************************\nNKEYs are sensitive and should be treated as secrets.\n\n-----BEGIN USER NKEY SEED-----\nSUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4\n------END USER NKEY SEED------\n")
	env := []string{
		"PATH=/usr/bin:/bin",
		"ANTHROPIC_API_KEY=sk-ant-api03-runner-key",
		"CLAUDE_CODE_OAUTH_TOKEN=oauth-token-value",
		"ORCH_GITEA_TOKEN=short",
		"TOKEN=bare-token-value",
		"ORCH_NATS_PASSWORD_FILE=" + write("nats-pass", "nats-password-from-file\n"),
		"ORCH_NATS_CREDS=" + creds,
		"ORCH_GIT_CREDENTIALS_FILE=" + write("git-credentials", "https://orch:git%2Ftoken%40x@git.example.com\nhttps://other:plaintoken99@other.example.com\nnot a url\n"),
		"ORCH_PROJECTS_FILE=" + write("projects.yaml", "projects: []\n"),
		"ORCH_PLANE_TOKEN_FILE=" + filepath.Join(dir, "missing"),
		"ORCH_NATS_CA_FILE=" + write("ca.pem", "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUY\n-----END CERTIFICATE-----\n"),
	}
	got := scrub.FromEnviron(env)
	slices.Sort(got)
	want := []string{
		"SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4",
		"bare-token-value",
		"eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5In0.eyJqdGkiOiJ",
		"git%2Ftoken%40x",
		"git/token@x",
		"nats-password-from-file",
		"oauth-token-value",
		"plaintoken99",
		"sk-ant-api03-runner-key",
	}
	if !slices.Equal(got, want) {
		t.Errorf("FromEnviron = %q\nwant %q", got, want)
	}
	for _, s := range got {
		if strings.Contains(s, "NKEYs are sensitive") {
			t.Errorf("a creds file's prose was taken for a secret: %q", s)
		}
	}
}
