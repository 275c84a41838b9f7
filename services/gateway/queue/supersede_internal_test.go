package queue

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/proto"
)

// behind is an index a write behind the bucket: it still knows its jobs
// as waiting in JOBS at their sequences, as just after they were
// published, whatever their records say since.
type behind map[string]waitingJob

type waitingJob struct {
	job *proto.Job
	seq uint64
}

func (b behind) OpenJobs(string, string) []string { return nil }
func (b behind) OlderOpenJobs(project, task string, kind proto.Kind, t time.Time) []string {
	var ids []string
	for id, w := range b {
		if j := w.job; j.Project == project && j.Task.ID == task && j.Kind == kind && j.CreatedAt.Before(t) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
func (b behind) Has(id string) bool                         { _, ok := b[id]; return ok }
func (b behind) Synced() bool                               { return true }
func (b behind) Queued(*proto.Job, uint64)                  {}
func (b behind) WaitingFor(time.Duration) map[string]uint64 { return nil }
func (b behind) Waiting(id string) (uint64, bool) {
	w, ok := b[id]
	return w.seq, ok
}

// A supersede that finds an older job waiting in JOBS, as the index
// says, while the job's record was written meanwhile, acts on the record:
// a job a runner took goes on running, one whose record says queued is
// superseded, and so is one with no record yet.
func TestSupersedeActsOnTheRecordTheIndexMissed(t *testing.T) {
	nc, js, kv := natstest.Connect(t, natstest.Server(t))
	st := status.New(kv)
	ctx := context.Background()
	at := time.Now().UTC()
	job := func(id string, created time.Time) *proto.Job {
		return &proto.Job{ID: id, Kind: proto.KindReview, Project: "widgets", Task: proto.Task{ID: "pr-1"}, CreatedAt: created}
	}
	taken, recorded, unrecorded := job("taken", at.Add(-3*time.Second)), job("recorded", at.Add(-2*time.Second)), job("unrecorded", at.Add(-time.Second))
	if _, err := st.Apply(ctx, taken, status.StartAttempt(1, 3, "r1", "", at)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Apply(ctx, recorded, status.Queue(0)); err != nil {
		t.Fatal(err)
	}
	index := behind{}
	for _, j := range []*proto.Job{taken, recorded, unrecorded} {
		data, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, proto.JobSubject(j.Project, j.Kind), data)
		if err != nil {
			t.Fatal(err)
		}
		index[j.ID] = waitingJob{j, ack.Sequence}
	}
	q := New(nil, index, nil, Config{}, zap.NewNop())
	q.conn.Store(&conn{nc: nc, js: js, status: st})
	newer := job("newer", at)
	q.supersede(q.conn.Load(), newer)

	for id, want := range map[string]proto.State{taken.ID: proto.StateRunning, recorded.ID: proto.StateCancelled, unrecorded.ID: proto.StateCancelled} {
		rec, _, err := st.Get(ctx, id)
		if err != nil {
			t.Fatalf("record of %s: %v", id, err)
		}
		if rec.State != want {
			t.Errorf("job %s is %s after the supersede, want %s", id, rec.State, want)
		}
		if want == proto.StateCancelled && rec.SupersededBy != newer.ID {
			t.Errorf("job %s superseded by %q, want %s", id, rec.SupersededBy, newer.ID)
		}
	}
}

// The jobs kept for the gateway's own supersedes are bounded by their
// encodings' bytes: the oldest go first, and a job bigger than the bound
// is not kept at all (it is read from JOBS when needed).
func TestRecentBounded(t *testing.T) {
	var r recent
	size := recentBytes / 4
	for i := range 6 {
		r.add(&proto.Job{ID: strconv.Itoa(i)}, size)
	}
	for i := range 6 {
		_, kept := r.get(strconv.Itoa(i))
		if want := i >= 2; kept != want {
			t.Errorf("job %d of 6, each a quarter of the bound: kept %v, want %v", i, kept, want)
		}
	}
	r.add(&proto.Job{ID: "huge"}, recentBytes+1)
	if _, kept := r.get("huge"); kept {
		t.Error("a job bigger than the bound was kept")
	}
	if _, kept := r.get("5"); !kept {
		t.Error("a job bigger than the bound pushed out the newest")
	}
	if r.bytes > recentBytes || len(r.jobs) != len(r.order) {
		t.Errorf("%d bytes in %d jobs, %d ids in order: past the bound of %d or out of step", r.bytes, len(r.jobs), len(r.order), recentBytes)
	}
}
