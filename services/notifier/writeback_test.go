package notifier

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/metricstest"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/trackertest"
	"github.com/orch-dev/orch/proto"
)

// The notifier, set up from its configuration with a Gitea URL and a
// token file, keeps the tracking comment of a job that ends in a terminal
// failure, next to the Telegram alert of the same failure; its /metrics
// counts the writes (Gitea's 503 on the first create as a retry) and
// shows no job left to write once it is done.
func TestNotifierWritesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const token = "gitea-SECRET-token-from-a-file"
	gitea := trackertest.NewGitea(t, token, "orch-bot")
	gitea.AddPR("acme/widgets", 42, strings.Repeat("a", 40))
	gitea.SetFault(func(r *http.Request, route string, n int) *trackertest.Fault {
		if r.Method == http.MethodPost && strings.HasSuffix(route, "/comments") && n == 1 {
			return &trackertest.Fault{Code: http.StatusServiceUnavailable}
		}
		return nil
	})
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
	cfg.HTTPAddr = "127.0.0.1:0"
	r := b.start(cfg, hooks{})
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
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		m := metricstest.Scrape(t, "http://"+r.n.metrics.addr+"/metrics")
		for series, least := range map[string]float64{
			`orch_notifier_writeback_writes_total{operation="comment",outcome="retry",tracker="gitea"}`: 1,
			`orch_notifier_writeback_writes_total{operation="comment",outcome="ok",tracker="gitea"}`:    1,
		} {
			if v, _ := m.Value(series); v < least {
				return fmt.Errorf("%s = %v, want at least %v", series, v, least)
			}
		}
		// How many states the status went through depends on how quickly
		// the job failed; every one Gitea took is counted.
		series := `orch_notifier_writeback_writes_total{operation="status",outcome="ok",tracker="gitea"}`
		if v, _ := m.Value(series); v != float64(len(gitea.Statuses(strings.Repeat("a", 40)))) {
			return fmt.Errorf("%s = %v, want %d, the statuses Gitea took", series, v, len(gitea.Statuses(strings.Repeat("a", 40))))
		}
		if v, ok := m.Value(`orch_notifier_writeback_writes_total{operation="comment",outcome="ok",tracker="plane"}`); !ok || v != 0 {
			return fmt.Errorf("plane comment writes = %v (served %v), want 0 and served", v, ok)
		}
		if v, ok := m.Value("orch_notifier_writeback_pending_jobs"); !ok || v != 0 {
			return fmt.Errorf("orch_notifier_writeback_pending_jobs = %v (served %v), want 0", v, ok)
		}
		m.Lint(t)
		return nil
	})
}
