package trigger

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/proto"
)

// checkDecision holds for every decision: every job is valid for a runner
// and its task id cannot escape a path or a subject.
func checkDecision(t *testing.T, d Decision) {
	for _, j := range d.Jobs {
		if err := j.Validate(); err != nil {
			t.Fatalf("invalid job: %v", err)
		}
		if proto.Token(j.Task.ID) != j.Task.ID || strings.Contains(j.Task.ID, "..") {
			t.Fatalf("unsafe task id %q", j.Task.ID)
		}
	}
	if d.Cancel != nil && proto.Token(d.Cancel.Task) != d.Cancel.Task {
		t.Fatalf("unsafe cancel task %q", d.Cancel.Task)
	}
}

func fuzzSeeds(f *testing.F, sender string) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", sender, "*.json"))
	for _, file := range files {
		if strings.HasSuffix(file, ".headers.json") {
			continue
		}
		body, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		_, h := fixture(f, sender+"/"+strings.TrimSuffix(filepath.Base(file), ".json"))
		event := h["X-Gitea-Event-Type"]
		if sender == "plane" {
			event = h["X-Plane-Event"]
		}
		f.Add(event, body)
	}
}

// The Gitea trigger table never panics and only makes safe jobs.
func FuzzGitea(f *testing.F) {
	fuzzSeeds(f, "gitea")
	reg := testRegistry(f)
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		d, err := Gitea(reg, event, "d", body, now)
		if err == nil {
			checkDecision(t, d)
		}
	})
}

// The Plane trigger table never panics and only makes safe jobs.
func FuzzPlane(f *testing.F) {
	fuzzSeeds(f, "plane")
	reg := testRegistry(f)
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		d, err := Plane(reg, event, "d", body, now)
		if err == nil {
			checkDecision(t, d)
		}
	})
}
