package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/services/gateway"
	"github.com/orch-dev/orch/services/gateway/ui"
	"github.com/orch-dev/orch/services/runner"
)

const browserToken = "browser-test-token-of-the-dashboard"

// browserAgent works for a while on pr-41, printing a line every fifth of
// a second (so its log grows while a person watches), fails pr-43 at
// once, and does pr-42 quickly.
const browserAgent = `
case "$ORCH_TASK" in
pr-41) i=0; while [ $i -lt 1500 ]; do i=$((i+1)); echo "step $i: checking <b>bold</b> & <script>alert(1)</script>"; sleep 0.2; done ;;
pr-43) echo "tests failed: <expected> & <got>"; exit 3 ;;
*) echo "looks good" ;;
esac
`

// startDashboardSystem runs JetStream and the three services as make run
// does, with the dashboard on (ORCH_API_TOKEN set) and browserAgent.
func startDashboardSystem(t *testing.T) *system {
	return newSystem(t, browserToken, func(string) string { return browserAgent }, func(cfg *runner.Config) {
		cfg.MaxAttempts, cfg.AckWait = 2, 3*time.Second
	})
}

// browserNames are the executables of a Chromium-based browser, Debian's
// package first.
var browserNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"}

// findBrowser returns a browser to drive. Without one the test is skipped
// on a developer's machine, and fails in CI, which always installs one.
func findBrowser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ORCH_TEST_BROWSER"); p != "" {
		return p
	}
	for _, name := range browserNames {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (looked for " + strings.Join(browserNames, ", ") + " and ORCH_TEST_BROWSER): run `make browser` to install Debian's chromium"
	testkit.Unavailable(t, msg)
	return ""
}

// artifactDir is where screenshots go: $ORCH_TEST_ARTIFACTS, or a
// directory under the system's temp dir that outlives the test.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("ORCH_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "orch-test-artifacts")
	}
	dir = filepath.Join(dir, "dashboard")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// newBrowser starts a headless Chromium for the test and closes it (and
// reaps its processes) when the test ends.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := findBrowser(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox cannot start
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// do runs browser actions with a generous deadline: the machine may be
// busy with other tests.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v\nthe browser shows: %s", what, err, shown(ctx))
	}
}

// shown is the browser's address and page text, for a failure message.
func shown(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return s
}

// get runs one browser action that answers a value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// click clicks the element sel once it is visible. The click happens in
// the page, in one step: the live update may swap the element for a
// fresh copy at any moment, and a click by node id could hit the old one.
func click(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS(sel)),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			js := fmt.Sprintf(`(function(){ var el = document.querySelector(%q); if (!el) return false; el.click(); return true; })()`, sel)
			ok, err := chromedp.Evaluate[bool](js)(ctx, t)
			if err == nil && !ok {
				err = fmt.Errorf("no %s to click", sel)
			}
			return err
		}),
	)
}

// text reads the text of the element sel, waiting at most a few seconds
// for it to exist.
func text(ctx context.Context, sel string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
}

// waitText waits until the text of the element sel contains want.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	natstest.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		got, err := text(ctx, sel)
		if err != nil {
			return err
		}
		if !strings.Contains(got, want) {
			return fmt.Errorf("%s says %q, want %q", sel, got, want)
		}
		return nil
	})
}

// screenshot saves the page at the given width (the height follows the
// page) as name.png.
func screenshot(t *testing.T, ctx context.Context, dir, name string, width int64) {
	t.Helper()
	do(t, ctx, "resize to "+name, chromedp.EmulateViewport(width, 900, chromedp.EmulateScale(1)),
		chromedp.Sleep(300*time.Millisecond)) // the layout settles after the resize; a picture only, nothing is asserted
	png := get(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100)) // 100: PNG, not JPEG
	do(t, ctx, "resize back", chromedp.EmulateViewport(1280, 900))
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func prNumber(n int, title string) func(map[string]any) {
	return func(p map[string]any) {
		p["number"] = n
		pr := p["pull_request"].(map[string]any)
		pr["number"] = n
		pr["title"] = title
	}
}

// TestDashboardInABrowser drives the dashboard in a real headless
// Chromium against the whole system: log in with the one-time link, see a
// job appear without a reload, follow its log, cancel it, retry a job that
// failed for good.
func TestDashboardInABrowser(t *testing.T) {
	ctx := newBrowser(t)
	sys := startDashboardSystem(t)
	shots := artifactDir(t)

	// A login link logs in and lands on a URL without its secret.
	do(t, ctx, "login link",
		chromedp.Navigate(sys.url+loginLink(t, sys.url, browserToken)),
		chromedp.WaitVisible(chromedp.CSS(`#jobs`)),
	)
	loc := get(t, ctx, "location", chromedp.Location())
	if loc != sys.url+"/ui/" {
		t.Fatalf("after login the browser is at %q, want %q", loc, sys.url+"/ui/")
	}
	// A marker on the window survives only as long as the page is not
	// reloaded.
	get(t, ctx, "mark the page", chromedp.Evaluate[int](`window.orchMarker = 1`))

	slow := sys.queuePR(t, prNumber(41, "Slow <b>work</b>"))
	row := fmt.Sprintf(`tr[data-job="%s"]`, slow)
	do(t, ctx, "job appears on the queue page", chromedp.WaitVisible(chromedp.CSS(row)))
	waitText(t, ctx, row, "running")
	if get(t, ctx, "no reload", chromedp.Evaluate[int](`window.orchMarker || 0`)) != 1 {
		t.Fatal("the queue page was reloaded instead of updated")
	}
	screenshot(t, ctx, shots, "queue-desktop", 1280)
	screenshot(t, ctx, shots, "queue-phone", 390)

	// Open the job; its log grows while the page is open.
	do(t, ctx, "open the job",
		click(row+` a`),
		chromedp.WaitVisible(chromedp.CSS(`#job-state`)),
	)
	waitText(t, ctx, `#job-state`, "running")
	waitText(t, ctx, `#log-1`, "step 3:")
	before := get(t, ctx, "read the log", chromedp.Text(chromedp.CSS(`#log-1`)))
	var after string
	natstest.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		var err error
		if after, err = text(ctx, `#log-1`); err != nil {
			return err
		}
		if strings.Count(after, "\n") < strings.Count(before, "\n")+5 {
			return fmt.Errorf("log has %d lines, had %d", strings.Count(after, "\n"), strings.Count(before, "\n"))
		}
		return nil
	})
	if !strings.Contains(after, "<script>alert(1)</script>") {
		t.Errorf("log lines are not shown as text: %q", after[:min(len(after), 200)])
	}
	if get(t, ctx, "no markup from the log", chromedp.Evaluate[int](`document.querySelectorAll('#log-1 b, #log-1 script').length`)) != 0 {
		t.Error("the log's HTML became elements")
	}
	screenshot(t, ctx, shots, "job-desktop", 1280)
	screenshot(t, ctx, shots, "job-phone", 390)

	// Cancel it, with the confirmation.
	do(t, ctx, "ask to cancel", click(`a[href$="/cancel"]`))
	do(t, ctx, "confirmation page", chromedp.WaitVisible(chromedp.CSS(`button#confirm`)))
	do(t, ctx, "confirm", click(`button#confirm`))
	do(t, ctx, "back on the job page", chromedp.WaitVisible(chromedp.CSS(`#job-state`)))
	waitText(t, ctx, `#job-state`, "cancelled")

	// A job that fails on every attempt lands in the dead letters; retry
	// it from there.
	failing := sys.queuePR(t, prNumber(43, "Breaks <everything>"))
	do(t, ctx, "dead letters", chromedp.Navigate(sys.url+"/ui/dead-letters"), chromedp.WaitVisible(chromedp.CSS(`#dead`)))
	retryLink := fmt.Sprintf(`a[href="/ui/jobs/%s/retry"]`, failing)
	do(t, ctx, "the failed job appears", chromedp.WaitVisible(chromedp.CSS(retryLink)))
	waitText(t, ctx, `#dead`, "Breaks <everything>")
	do(t, ctx, "retry",
		click(retryLink),
		chromedp.WaitVisible(chromedp.CSS(`button#confirm`)),
		click(`button#confirm`),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`a[href="/ui/jobs/%s"]`, failing))),
	)
	loc = get(t, ctx, "location", chromedp.Location())
	if strings.HasSuffix(loc, "/ui/jobs/"+failing) || !strings.Contains(loc, "/ui/jobs/") {
		t.Fatalf("after retry the browser is at %q, want the new job's page", loc)
	}
	// The new job runs (and, this agent being what it is, fails again).
	waitText(t, ctx, `#status`, "Attempt")
	natstest.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		state, err := text(ctx, `#job-state`)
		if err != nil {
			return err
		}
		if state == "queued" {
			return fmt.Errorf("the retried job is still %s", state)
		}
		return nil
	})
}

// loginLink makes a login link of the dashboard at url with the API
// token, as an operator does, and returns its path. The gateway answers
// 503 until it has reached the bucket of logins.
func loginLink(t *testing.T, url, token string) string {
	t.Helper()
	var link ui.LoginLink
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		req, _ := http.NewRequest(http.MethodPost, url+"/ui/login-links", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST /ui/login-links: %s", resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(&link)
	})
	return link.Link
}

func TestMakeRunNamesTheGatewayAsAPersonTypesIt(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		":8080": "localhost:8080", "127.0.0.1:9000": "127.0.0.1:9000", "0.0.0.0:8080": "localhost:8080", "[::]:8080": "localhost:8080",
	} {
		if got := localAddr(gateway.Config{HTTPAddr: addr}); got != want {
			t.Errorf("localAddr(%q) = %q, want %q", addr, got, want)
		}
	}
}
