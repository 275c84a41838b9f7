package planenames

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/kit/trackertest"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

const (
	project = "22b6fc9c-1849-45da-b103-52a3e3a6b4c1"
	item    = "8f0e6a52-3d1b-4c7e-9a2f-61b5d4c3e2a1"
	key     = "plane_api_key_0123456789"
)

func reg(t *testing.T) *registry.Registry {
	t.Helper()
	r, err := registry.Parse([]byte("projects:\n  - key: widgets\n    gitea_repo: acme/widgets\n    plane_project: " + project + "\n    plane_workspace: acme\n"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// comment is the gateway's comment fixture: it names the item by id only.
func comment(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "plane", "issue_comment__created.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return zap.New(core), logs
}

// A comment's item is named <IDENTIFIER>-<sequence> from two reads of
// Plane's API; the project's identifier and the item's name are read once.
func TestNameFromAPI(t *testing.T) {
	plane := trackertest.NewPlane(t, key)
	plane.SetIdentifier("acme", project, "WID")
	plane.AddItemSeq("acme", project, item, 41)
	r := New(Config{URL: plane.URL, Token: key})
	for range 3 {
		if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "WID-41" {
			t.Fatalf("name %q, want WID-41", got)
		}
	}
	if n := len(plane.Requests()); n != 2 {
		t.Errorf("%d requests to Plane, want 2 (the project and the item, once)", n)
	}
}

// A 429 holds every lookup off for its Retry-After: the deliveries in
// between keep the item's id without asking Plane, and the fallback is
// logged once for the project.
func TestRateLimitHoldsOff(t *testing.T) {
	plane := trackertest.NewPlane(t, key)
	plane.SetIdentifier("acme", project, "WID")
	plane.AddItemSeq("acme", project, item, 41)
	plane.RateLimit = 1
	var clock atomic.Int64
	now := func() time.Time { return time.Unix(1_700_000_000, 0).Add(time.Duration(clock.Load())) }
	plane.Now = now
	log, logs := observed()
	r := New(Config{URL: plane.URL, Token: key, Now: now, Log: log})
	// The project's read takes the minute's one request; the item's is
	// refused with DRF's Retry-After.
	if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "" {
		t.Fatalf("name %q while rate limited, want none", got)
	}
	asked := len(plane.Requests())
	for range 3 {
		if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "" {
			t.Fatalf("name %q while held off, want none", got)
		}
	}
	if n := len(plane.Requests()); n != asked {
		t.Errorf("%d more requests while held off, want none", n-asked)
	}
	if n := logs.FilterMessageSnippet("named by their ids").Len(); n != 1 {
		t.Errorf("fallback logged %d times, want once for the project", n)
	}
	clock.Add(int64(61 * time.Second))
	if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "WID-41" {
		t.Errorf("name %q after the hold, want WID-41", got)
	}
}

// A Plane that does not answer costs a delivery at most the budget.
func TestBudgetBoundsTheWait(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer slow.Close()
	defer close(release)
	r := New(Config{URL: slow.URL, Token: key, Budget: 200 * time.Millisecond})
	start := time.Now()
	if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "" {
		t.Errorf("name %q, want none", got)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s, want about the budget", took)
	}
}

// An item whose jobs are named by its id keeps that name whatever the API
// says; one whose jobs carry a name keeps it without asking.
func TestKnownNameWins(t *testing.T) {
	plane := trackertest.NewPlane(t, key)
	plane.SetIdentifier("acme", project, "WID")
	plane.AddItemSeq("acme", project, item, 41)
	known := map[string]string{}
	r := New(Config{URL: plane.URL, Token: key, Known: func(p, i string) (string, bool) {
		n, ok := known[p+"/"+i]
		return n, ok
	}})
	known["widgets/"+item] = item
	if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "" {
		t.Errorf("name %q for an item known by its id, want none", got)
	}
	known["widgets/"+item] = "wid-7"
	if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "wid-7" {
		t.Errorf("name %q, want the known wid-7", got)
	}
	if n := len(plane.Requests()); n != 0 {
		t.Errorf("%d requests to Plane, want none", n)
	}
}

// Without ORCH_PLANE_URL the item keeps its id, logged once per project.
func TestNoAPI(t *testing.T) {
	log, logs := observed()
	r := New(Config{Log: log})
	for range 2 {
		if got := r.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "" {
			t.Errorf("name %q, want none", got)
		}
	}
	if n := logs.FilterMessageSnippet("named by their ids").Len(); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	var nilResolver *Resolver
	if got := nilResolver.Name(t.Context(), reg(t), "issue_comment", comment(t)); got != "" {
		t.Errorf("nil resolver named %q", got)
	}
}
