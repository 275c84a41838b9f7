package index

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// The index follows records as they change: counts per state, the most
// recently changed first, and only a task's unfinished jobs are open.
func TestIndex(t *testing.T) {
	ix := New()
	put := func(id, project, task string, s proto.State) {
		ix.Put(&proto.Status{Job: proto.Job{ID: id, Project: project, Task: proto.Task{ID: task}}, State: s})
	}
	put("a", "widgets", "t1", proto.StateQueued)
	put("b", "widgets", "t1", proto.StateRunning)
	put("c", "widgets", "t2", proto.StateQueued)
	put("a", "widgets", "t1", proto.StateDone)
	ix.remove("c")
	put("g", "gadgets", "t9", proto.StateQueued)
	put("g", "gadgets", "t9", proto.StateHeld)
	put("h", "gizmos", "t8", proto.StateQueued)
	ix.remove("h")

	if got, want := ix.OpenJobs("widgets", "t1"), []string{"b"}; !slices.Equal(got, want) {
		t.Errorf("open jobs %v, want %v", got, want)
	}
	if got := ix.OpenJobs("widgets", "t2"); len(got) != 0 {
		t.Errorf("a removed record is still open: %v", got)
	}
	// The jobs a new one supersedes: open, of its kind, created before it.
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	older := func(id string, kind proto.Kind, created time.Time, s proto.State) {
		ix.Put(&proto.Status{Job: proto.Job{ID: id, Kind: kind, Project: "widgets", Task: proto.Task{ID: "t3"}, CreatedAt: created}, State: s})
	}
	older("r1", proto.KindReview, at.Add(-time.Minute), proto.StateQueued)
	older("r2", proto.KindReview, at.Add(-time.Second), proto.StateRunning)
	older("r3", proto.KindReview, at.Add(-time.Hour), proto.StateDone)
	older("r4", proto.KindReview, at, proto.StateQueued)
	older("x1", proto.KindRespond, at.Add(-time.Minute), proto.StateQueued)
	if got, want := ix.OlderOpenJobs("widgets", "t3", proto.KindReview, at), []string{"r1", "r2"}; !slices.Equal(got, want) {
		t.Errorf("older open review jobs %v, want %v", got, want)
	}
	// The index takes each version of a record as it comes: one that
	// says open again after an ended one is open again.
	older("r3", proto.KindReview, at.Add(-time.Hour), proto.StateQueued)
	if got, want := ix.OlderOpenJobs("widgets", "t3", proto.KindReview, at), []string{"r1", "r2", "r3"}; !slices.Equal(got, want) {
		t.Errorf("older open review jobs after r3 said queued again %v, want %v", got, want)
	}
	for _, id := range []string{"r1", "r2", "r3", "r4", "x1"} {
		ix.remove(id)
	}
	counts := ix.Counts()
	if counts[proto.StateDone] != 1 || counts[proto.StateRunning] != 1 || counts[proto.StateQueued] != 0 || len(counts) != len(proto.States) {
		t.Errorf("counts %v", counts)
	}
	// Per project, only the states a project has, and no project whose
	// last job went.
	byProject := ix.ProjectCounts()
	want := map[string]map[proto.State]int{
		"widgets": {proto.StateDone: 1, proto.StateRunning: 1},
		"gadgets": {proto.StateHeld: 1},
	}
	if !maps.EqualFunc(byProject, want, maps.Equal) {
		t.Errorf("project counts %v, want %v", byProject, want)
	}
	var ids []string
	for _, r := range ix.Recent(10) {
		ids = append(ids, r.ID)
	}
	if want := []string{"g", "a", "b"}; !slices.Equal(ids, want) {
		t.Errorf("recent %v, want %v", ids, want)
	}
}

// GET /queue reads the per-project counts on every call: their cost must
// not grow with the jobs indexed (100,000 here, as make bench's row).
func BenchmarkProjectCounts(b *testing.B) {
	ix := New()
	for i := range 100_000 {
		project := []string{"widgets", "gadgets", "gizmos", "doohickeys"}[i%4]
		ix.Put(&proto.Status{Job: proto.Job{ID: strconv.Itoa(i), Project: project, Task: proto.Task{ID: strconv.Itoa(i)}}, State: proto.StateQueued})
	}
	for b.Loop() {
		if n := len(ix.ProjectCounts()); n != 4 {
			b.Fatalf("%d projects", n)
		}
	}
}

// Every webhook looks up its task's older open jobs (supersede): the
// cost must not grow with the task's ended jobs, which the index keeps
// until the bucket expires them (10,000 here, one open).
func BenchmarkOlderOpenJobs(b *testing.B) {
	ix := New()
	for i := range 10_000 {
		ix.Put(&proto.Status{Job: proto.Job{ID: strconv.Itoa(i), Kind: proto.KindReview, Project: "widgets", Task: proto.Task{ID: "pr-1"}}, State: proto.StateCancelled})
	}
	ix.Put(&proto.Status{Job: proto.Job{ID: "open", Kind: proto.KindReview, Project: "widgets", Task: proto.Task{ID: "pr-1"}}, State: proto.StateQueued})
	at := time.Now()
	for b.Loop() {
		if n := len(ix.OlderOpenJobs("widgets", "pr-1", proto.KindReview, at)); n != 1 {
			b.Fatalf("%d open jobs, want 1", n)
		}
	}
}
