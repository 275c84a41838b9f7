package ui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
)

// The dashboard shows a held job's reason and until when, and runs it on
// request (confirmed, with CSRF); the queue page shows each budgeted
// project's spend today and this month against its budget, and a usage
// pause with its reset time.
func TestHeldJobSpendAndPauses(t *testing.T) {
	t.Parallel()
	reg := filepath.Join(t.TempDir(), "projects.yaml")
	if err := os.WriteFile(reg, []byte("projects:\n  - key: widgets\n    gitea_repo: acme/widgets\n    budget: {daily_usd: 1, monthly_usd: 30}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, func(c *gateway.Config) { c.ProjectsFile = reg })
	ctx := context.Background()
	now := time.Now().UTC()
	until := proto.WindowEnd(proto.WindowDay, now, time.UTC)
	e.put(proto.Status{Job: job("h1", "pr-1", "Held review"), State: proto.StateHeld, HeldReason: proto.HoldOverBudget,
		HeldUntil: until, HeldAt: now, Holds: 1})
	spend, err := e.js.KeyValue(ctx, proto.BucketSpend)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(proto.Spend{USD: 1.2})
	if _, err := spend.Put(ctx, proto.SpendKey("widgets", proto.WindowDay, now, time.UTC), data); err != nil {
		t.Fatal(err)
	}
	pauses, err := e.js.KeyValue(ctx, proto.BucketPauses)
	if err != nil {
		t.Fatal(err)
	}
	data, _ = json.Marshal(proto.Pause{Reason: proto.HoldUsageLimit, Since: now, Until: now.Add(time.Hour), Job: "h0"})
	if _, err := pauses.Put(ctx, proto.UsagePauseKey("c0ffee"), data); err != nil {
		t.Fatal(err)
	}

	c := e.loggedIn()
	page := c.waitPage("/ui/jobs/h1", "budget spent")
	if !strings.Contains(page.body, until.Format(time.RFC3339)) || !strings.Contains(page.body, "Run now") {
		t.Errorf("held job page does not say until when, or offer to run it:\n%s", page.body)
	}
	q := c.waitPage("/ui/", "c0ffee")
	for _, want := range []string{`data-spend="widgets"`, "1.20", "of $1.00", "spent", "of $30.00", "usage limit"} {
		if !strings.Contains(q.body, want) {
			t.Errorf("queue page lacks %q", want)
		}
	}
	if a := c.get("/ui/jobs/h1/release"); a.code != http.StatusOK || !strings.Contains(a.body, "Run this job now?") {
		t.Fatalf("release confirmation: %d", a.code)
	}
	a := c.post("/ui/jobs/h1/release", url.Values{"csrf": {c.csrf("/ui/jobs/h1/release")}})
	if a.code != http.StatusSeeOther {
		t.Fatalf("release: %d %s", a.code, a.body)
	}
	if s := e.state("h1"); s != proto.StateQueued {
		t.Errorf("job is %s after release, want queued", s)
	}
}
