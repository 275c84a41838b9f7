package prompt_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/prompt"
)

func job(kind proto.Kind) *proto.Job {
	return &proto.Job{ID: "j1", Kind: kind, Project: "widgets", Trigger: "@agent please look at <this>",
		Task: proto.Task{ID: "pr-42", Title: "Add size", Body: "The body.", URL: "https://git.example/acme/widgets/pulls/42", PR: 42, Branch: "feature/size"}}
}

func TestEmbeddedPerKind(t *testing.T) {
	tmpls, err := prompt.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	for kind, heading := range map[proto.Kind]string{proto.KindImplement: "# Implement", proto.KindReview: "# Review", proto.KindFix: "# Fix", proto.KindRespond: "# Respond", proto.KindCleanup: "# cleanup"} {
		text, err := tmpls.Render(prompt.Data{Job: job(kind), Attempt: 2, Max: 3, Branch: "agent/pr-42"})
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{heading, "Add size", "The body.", "https://git.example/acme/widgets/pulls/42", "#42", "@agent please look at <this>", "attempt 2 of 3", "agent/pr-42", "feature/size"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s task lacks %q:\n%s", kind, want, text)
			}
		}
	}
}

// The task names the commit the worktree was prepared at, the branch a
// push updates, and every note about kept work.
func TestHeadAndNotes(t *testing.T) {
	tmpls, err := prompt.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	text, err := tmpls.Render(prompt.Data{Job: job(proto.KindReview), Attempt: 1, Max: 3, Branch: "feature/size",
		Head: "0123456789abcdef0123456789abcdef01234567", Upstream: "origin/feature/size",
		Notes: []string{"The branch holds 2 commit(s) that are not on the remote", "uncommitted changes"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"prepared at commit `0123456789abcdef0123456789abcdef01234567`", "tracks `origin/feature/size`",
		"**Note:** The branch holds 2 commit(s)", "**Note:** uncommitted changes"} {
		if !strings.Contains(text, want) {
			t.Errorf("task lacks %q:\n%s", want, text)
		}
	}
	plain, _ := tmpls.Render(prompt.Data{Job: job(proto.KindReview), Attempt: 1, Max: 3, Branch: "agent/pr-42"})
	if strings.Contains(plain, "Note:") || strings.Contains(plain, "prepared at") || strings.Contains(plain, "tracks") {
		t.Errorf("task without a head or notes mentions them:\n%s", plain)
	}
}

func TestProjectOverride(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmpl"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmpl", "review.md"), []byte("Custom review of {{.Job.Task.Title}}\n{{template \"foot\" .}}"), 0o644); err != nil {
		t.Fatal(err)
	}
	regFile := filepath.Join(dir, "projects.yaml")
	yaml := "projects:\n  - key: widgets\n    gitea_repo: acme/widgets\n    templates: {review: tmpl/review.md}\n  - key: other\n    gitea_repo: acme/other\n"
	if err := os.WriteFile(regFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Load(regFile)
	if err != nil {
		t.Fatal(err)
	}
	tmpls, err := prompt.Load(reg)
	if err != nil {
		t.Fatal(err)
	}
	text, err := tmpls.Render(prompt.Data{Job: job(proto.KindReview), Attempt: 1, Max: 3})
	if err != nil || !strings.HasPrefix(text, "Custom review of Add size") || !strings.Contains(text, "attempt 1 of 3") {
		t.Errorf("override: %q, %v", text, err)
	}
	other := job(proto.KindReview)
	other.Project = "other"
	if text, _ := tmpls.Render(prompt.Data{Job: other, Attempt: 1, Max: 3}); !strings.HasPrefix(text, "# Review") {
		t.Errorf("other project got %q, want the default", text)
	}
	if text, _ := tmpls.Render(prompt.Data{Job: job(proto.KindFix), Attempt: 1, Max: 3}); !strings.HasPrefix(text, "# Fix") {
		t.Errorf("kind without override got %q, want the default", text)
	}

	// A missing template file stops the runner at start.
	if err := os.WriteFile(regFile, []byte(strings.Replace(yaml, "tmpl/review.md", "tmpl/missing.md", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, _ = registry.Load(regFile)
	if _, err := prompt.Load(reg); err == nil || !strings.Contains(err.Error(), "missing.md") {
		t.Errorf("missing template: %v", err)
	}
}
