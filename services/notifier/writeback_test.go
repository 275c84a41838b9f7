package notifier

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/natstest"
	"github.com/orch-dev/orch/proto/trackertest"
)

// The notifier, set up from its configuration with a Gitea URL and a
// token file, keeps the tracking comment of a job that ends in a terminal
// failure, next to the Telegram alert of the same failure.
func TestNotifierWritesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const token = "gitea-SECRET-token-from-a-file"
	gitea := trackertest.NewGitea(t, token, "orch-bot")
	gitea.AddPR("acme/widgets", 42, strings.Repeat("a", 40))
	dir := t.TempDir()
	reg := filepath.Join(dir, "projects.yaml")
	tokenFile := filepath.Join(dir, "gitea-token")
	if err := os.WriteFile(reg, []byte("projects:\n  - key: widgets\n    gitea_repo: acme/widgets\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := b.config()
	cfg.PublicURL = "https://orch.example.com"
	cfg.ProjectsFile, cfg.GiteaURL, cfg.GiteaTokenFile = reg, gitea.URL, tokenFile
	b.start(cfg, hooks{})
	job := b.queue("wb", "Make the widget spin")
	b.run(map[string]action{job.ID: actFail})
	b.settled(30 * time.Second)
	b.checkDeadLettered(job)
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		cs := gitea.Comments("acme/widgets", 42)
		if len(cs) != 1 || !strings.Contains(cs[0].Body, "❌ orch · review · failed") || !strings.Contains(cs[0].Body, proto.CommentMarker(job.ID)) {
			return fmt.Errorf("comments %+v, want one showing the failure", cs)
		}
		if st := gitea.Statuses(strings.Repeat("a", 40)); len(st) == 0 || st[len(st)-1].State != "failure" {
			return fmt.Errorf("statuses %+v, want the last failure", st)
		}
		return nil
	})
	for _, line := range b.logs.All() {
		if strings.Contains(line.Message+fmt.Sprint(line.ContextMap()), "SECRET") {
			t.Errorf("the Gitea token reached a log line")
		}
	}
}
