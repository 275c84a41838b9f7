package queue

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/orch-dev/orch/proto"
)

func bigJob(body, trigger, title string) *proto.Job {
	return &proto.Job{
		Schema: proto.SchemaVersion, ID: proto.JobID("fit"), Kind: proto.KindReview, Project: "widgets",
		Task:   proto.Task{ID: "pr-42", Title: title, Body: body, URL: "https://git.example.com/acme/widgets/pulls/42", PR: 42},
		Source: proto.Source{System: "gitea", Event: "pull_request"}, Trigger: trigger,
	}
}

// Every job comes out at most limit bytes as published, its texts cut
// only as far as needed, each cut one with the marker naming the URL.
func TestFitCutsToTheLimit(t *testing.T) {
	const limit = 16 << 10
	tests := []struct {
		name                 string
		body, trigger, title string
		wantCut              []string // fields that must carry the marker
	}{
		{"fits already", "short", "also short", "title", nil},
		{"big body", strings.Repeat("a", 1<<20), "comment", "title", []string{"body"}},
		{"body of characters JSON escapes", strings.Repeat("<&>\"\\\n\x01\u2028", 50_000), "", "title", []string{"body"}},
		{"invalid UTF-8", strings.Repeat("\xff\xfe", 40_000), "", "t", []string{"body"}},
		{"multi-byte runes", strings.Repeat("日本語", 40_000), "", "t", []string{"body"}},
		{"body and trigger both big", strings.Repeat("b", 12<<10), strings.Repeat("c", 12<<10), "title", []string{"body"}},
		{"everything big", strings.Repeat("b", 1<<20), strings.Repeat("c", 1<<20), strings.Repeat("d", 1<<20), []string{"body", "trigger", "title"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := bigJob(tt.body, tt.trigger, tt.title)
			cut, err := Fit(job, limit)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := json.Marshal(job)
			if len(data) > limit {
				t.Errorf("job takes %d bytes, over %d", len(data), limit)
			}
			if len(tt.wantCut) == 0 && cut != 0 {
				t.Errorf("cut %d bytes of a job that fits", cut)
			}
			fields := map[string]string{"body": job.Task.Body, "trigger": job.Trigger, "title": job.Task.Title}
			for _, name := range tt.wantCut {
				f := fields[name]
				if !strings.Contains(f, "bytes cut here") || !strings.HasSuffix(f, job.Task.URL+"]") {
					t.Errorf("%s has no marker naming the URL: ...%q", name, f[max(0, len(f)-200):])
				}
			}
			if !utf8.ValidString(job.Task.Body) && utf8.ValidString(tt.body) {
				t.Error("the cut split a rune")
			}
			// The limit is used, not wasted: the cut leaves little room.
			if len(tt.wantCut) > 0 && len(data) < limit-limit/8 {
				t.Errorf("job takes %d bytes of %d: cut more than needed", len(data), limit)
			}
		})
	}
}

func TestFitRefusesWhatCannotFit(t *testing.T) {
	job := bigJob("body", "", "title")
	job.Task.URL = "https://example.com/" + strings.Repeat("x", 64<<10)
	_, err := Fit(job, 16<<10)
	if !errors.Is(err, ErrPermanent) || !Permanent(err) {
		t.Fatalf("Fit = %v, want ErrPermanent", err)
	}
}
