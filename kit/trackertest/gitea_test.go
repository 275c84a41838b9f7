package trackertest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The fake answers as Gitea 1.26.0 did to the same requests, recorded with
// deployments/local/realgitea.sh: the codes, the error messages, and the
// fields of a commit status. A test that passes against the fake then
// holds against the real server.
func TestGiteaAnswersAsGitea126(t *testing.T) {
	t.Parallel()
	g := NewGitea(t, "tok", "agent-bot")
	const head, old = "60ffbbfc8a91180b68b8df55b0c97c749dc235da", "3c7985cc6f843f6f1a2aae289e4faa9affbc677c"
	g.AddPR("acme/widgets", 1, old)
	g.AddPR("acme/widgets", 1, head) // a push: the old head keeps its statuses
	g.AddPR("acme/widgets", 2, head)
	g.DeletePR("acme/widgets", 2)
	tests := []struct {
		name, auth, method, path, body string
		code                           int
		message                        string // the answer's "message"; "-" for a 2xx
	}{
		{"no token", "", "GET", "/repos/acme/widgets/pulls/1", "", 401, "token is required"},
		{"wrong token", "token bad", "GET", "/repos/acme/widgets/pulls/1", "", 401, "invalid username, password or token"},
		{"pull request", "", "GET", "/repos/acme/widgets/pulls/1", "", 200, "-"},
		{"missing pull request", "", "GET", "/repos/acme/widgets/pulls/999", "", 404, "not found"},
		{"deleted pull request", "", "GET", "/repos/acme/widgets/pulls/2", "", 404, "not found"},
		{"issue of a pull request", "", "GET", "/repos/acme/widgets/issues/1", "", 200, "-"},
		{"deleted pull request's issue", "", "GET", "/repos/acme/widgets/issues/2", "", 404, "not found"},
		{"comments of a missing issue", "", "GET", "/repos/acme/widgets/issues/999/comments", "", 500, ""},
		{"comments of a deleted pull request", "", "GET", "/repos/acme/widgets/issues/2/comments", "", 500, ""},
		{"comment on a missing issue", "", "POST", "/repos/acme/widgets/issues/999/comments", `{"body":"x"}`, 500, ""},
		{"empty comment", "", "POST", "/repos/acme/widgets/issues/1/comments", `{"body":""}`, 422, "[Body]: Required"},
		{"comment", "", "POST", "/repos/acme/widgets/issues/1/comments", `{"body":"x"}`, 201, "-"},
		{"edit of a missing comment", "", "PATCH", "/repos/acme/widgets/issues/comments/99999", `{"body":"x"}`, 404, "not found"},
		{"status on the head", "", "POST", "/repos/acme/widgets/statuses/" + head, `{"state":"pending","context":"orch/review"}`, 201, "-"},
		{"status on an earlier head", "", "POST", "/repos/acme/widgets/statuses/" + old, `{"state":"success","context":"orch/review"}`, 201, "-"},
		{"status with a state Gitea does not know", "", "POST", "/repos/acme/widgets/statuses/" + head, `{"state":"bogus","context":"orch/x"}`, 201, "-"},
		{"status on an unknown commit", "", "POST", "/repos/acme/widgets/statuses/0000000000000000000000000000000000000001", `{"state":"success","context":"orch/x"}`, 500, ""},
	}
	for _, tt := range tests {
		auth := tt.auth
		if auth == "" && !strings.HasPrefix(tt.name, "no token") {
			auth = "token tok"
		}
		var body io.Reader
		if tt.body != "" {
			body = strings.NewReader(tt.body)
		}
		req, err := http.NewRequest(tt.method, g.URL+"/api/v1"+tt.path, body)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var ans map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if resp.StatusCode != tt.code {
			t.Errorf("%s: %s %s answered %d, Gitea 1.26 answers %d", tt.name, tt.method, tt.path, resp.StatusCode, tt.code)
			continue
		}
		if tt.message != "-" && ans["message"] != tt.message {
			t.Errorf("%s: message %q, Gitea 1.26 says %q", tt.name, ans["message"], tt.message)
		}
		if strings.HasPrefix(tt.name, "status on the head") {
			for _, f := range []string{"id", "status", "context", "target_url", "description", "url", "creator", "created_at"} {
				if _, ok := ans[f]; !ok {
					t.Errorf("a status answer lacks %q, which Gitea 1.26 sends: %v", f, ans)
				}
			}
		}
	}
	if n := len(g.Statuses(old)); n != 1 {
		t.Errorf("the earlier head holds %d statuses, want 1", n)
	}
}
