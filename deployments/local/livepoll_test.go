package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orch-dev/orch/kit/natstest"
)

// The job page's live polls carry no log (X-Orch-Live); when an attempt
// ends, the logs section's key changes and the script reads the whole page
// once for it: the open page then shows the ended attempt's log, without
// a reload, and never the empty section of a poll.
func TestJobPageShowsTheLogOnceTheAttemptEnds(t *testing.T) {
	ctx := newBrowser(t)
	sys := startDashboardSystem(t)
	do(t, ctx, "login link",
		chromedp.Navigate(sys.url+loginLink(t, sys.url, browserToken)),
		chromedp.WaitVisible(chromedp.CSS(`#jobs`)),
	)
	slow := sys.queuePR(t, prNumber(41, "Slow work"))
	do(t, ctx, "open the job",
		chromedp.Navigate(sys.url+"/ui/jobs/"+slow),
		chromedp.WaitVisible(chromedp.CSS(`#job-state`)),
	)
	waitText(t, ctx, `#job-state`, "running")
	// The running attempt's log arrives through its followed stream.
	waitText(t, ctx, `#log-1`, "step 2:")
	get(t, ctx, "mark the page", chromedp.Evaluate[int](`window.orchMarker = 1`))

	// Cancel through the API, so the page sees it only by polling.
	req, _ := http.NewRequest(http.MethodPost, sys.url+"/jobs/"+slow+"/cancel", nil)
	req.Header.Set("Authorization", "Bearer "+browserToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("cancel: %s", resp.Status)
	}
	waitText(t, ctx, `#job-state`, "cancelled")
	natstest.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		key := get(t, ctx, "logs key", chromedp.Evaluate[string](`document.getElementById("logs").getAttribute("data-key")`))
		if key != "1-cancelled" {
			return fmt.Errorf("the logs section's key is %q, want 1-cancelled", key)
		}
		return nil
	})
	if partial := get(t, ctx, "partial logs", chromedp.Evaluate[bool](`document.querySelector("#logs[data-partial]") !== null`)); partial {
		t.Error("the page shows a poll's logs section, which has no logs")
	}
	log, err := text(ctx, `#log-1`)
	if err != nil || !strings.Contains(log, "step 2:") {
		t.Errorf("after the attempt ended the page shows the log %q (%v), want its lines", log[:min(len(log), 200)], err)
	}
	if get(t, ctx, "follows", chromedp.Evaluate[int](`document.querySelectorAll("pre[data-follow]").length`)) != 0 {
		t.Error("the ended attempt's log is still followed")
	}
	if get(t, ctx, "no reload", chromedp.Evaluate[int](`window.orchMarker || 0`)) != 1 {
		t.Error("the job page was reloaded instead of updated")
	}
}
