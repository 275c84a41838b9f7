package index

import (
	"testing"

	"slices"

	"github.com/orch-dev/orch/proto"
)

// The index follows records as they change: counts per state, the most
// recently changed first, and only a task's unfinished jobs are open.
func TestIndex(t *testing.T) {
	ix := New()
	put := func(id, task string, s proto.State) {
		ix.Put(&proto.Status{Job: proto.Job{ID: id, Project: "widgets", Task: proto.Task{ID: task}}, State: s})
	}
	put("a", "t1", proto.StateQueued)
	put("b", "t1", proto.StateRunning)
	put("c", "t2", proto.StateQueued)
	put("a", "t1", proto.StateDone)
	ix.remove("c")

	if got, want := ix.OpenJobs("widgets", "t1"), []string{"b"}; !slices.Equal(got, want) {
		t.Errorf("open jobs %v, want %v", got, want)
	}
	if got := ix.OpenJobs("widgets", "t2"); len(got) != 0 {
		t.Errorf("a removed record is still open: %v", got)
	}
	counts := ix.Counts()
	if counts[proto.StateDone] != 1 || counts[proto.StateRunning] != 1 || counts[proto.StateQueued] != 0 || len(counts) != len(proto.States) {
		t.Errorf("counts %v", counts)
	}
	var ids []string
	for _, r := range ix.Recent(10) {
		ids = append(ids, r.ID)
	}
	if want := []string{"a", "b"}; !slices.Equal(ids, want) {
		t.Errorf("recent %v, want %v", ids, want)
	}
}
