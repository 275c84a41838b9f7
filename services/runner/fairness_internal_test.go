package runner

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
)

// judge's rows: limits first, then fair share (another project with
// none running, or two fewer; among projects with none, the round-robin's
// turn; each only for a project the stream's order has not served in as
// many admissions as projects wait, and a job delivered here counted as
// running), then priority; a job that may not be deferred runs when its
// project has room and waits when it has none.
func TestJudge(t *testing.T) {
	a := &registry.Project{Key: "a"}
	b := &registry.Project{Key: "b"}
	one := &registry.Project{Key: "one", MaxConcurrency: 1}
	lowFix := &registry.Project{Key: "a", Priority: map[string]string{"respond": "low"}}
	projects := []*registry.Project{a, b, one}
	// long ago: no project had a job admitted in the last 10 admissions;
	// aServed and bServed: a's, b's was the last.
	long := turns{n: 10, served: map[string]uint64{}}
	aServed := turns{n: 10, served: map[string]uint64{"a": 10}}
	bServed := turns{n: 10, served: map[string]uint64{"b": 10}}
	view := func(running map[string]int, queued map[string]map[proto.Kind]int) *queueView {
		return &queueView{running: running, queued: queued}
	}
	implement := proto.KindImplement
	for _, tc := range []struct {
		name     string
		v        *queueView
		job      *proto.Job
		p        *registry.Project
		mayDefer bool
		turns    turns
		want     admission
	}{
		{"nothing else waits", view(map[string]int{"a": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitRun},
		{"another project with fewer running waits", view(map[string]int{"a": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitDefer},
		{"another with more running waits", view(map[string]int{"a": 0, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitRun},
		{"one fewer running: left to the stream's order", view(map[string]int{"a": 2, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, aServed, admitRun},
		{"two fewer running", view(map[string]int{"a": 3, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitDefer},
		{"as many running, the other's turn: left to the stream's order", view(map[string]int{"a": 1, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, aServed, admitRun},
		{"none running either, the other's turn", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, aServed, admitDefer},
		{"none running either, its own turn", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, bServed, admitRun},
		{"none running in the other, its job admitted one admission ago: left to the stream's order", view(map[string]int{"a": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, turns{n: 10, served: map[string]uint64{"b": 9, "a": 10}}, admitRun},
		{"two fewer running, the other's job admitted one admission ago: left to the stream's order", view(map[string]int{"a": 3, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, turns{n: 10, served: map[string]uint64{"b": 9, "a": 10}}, admitRun},
		{"two fewer running, the other's job admitted two admissions ago, two projects waiting", view(map[string]int{"a": 3, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, turns{n: 10, served: map[string]uint64{"b": 8, "a": 10}}, admitDefer},
		{"the other's one waiting job delivered here", &queueView{running: map[string]int{"a": 1}, here: map[string]int{"b": 1}, queued: map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}}, &proto.Job{Project: "a", Kind: implement}, a, true, long, admitRun},
		{"a job of the other's delivered here counts as running", &queueView{running: map[string]int{"a": 2}, here: map[string]int{"b": 1}, queued: map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 3}}}, &proto.Job{Project: "a", Kind: implement}, a, true, long, admitRun},
		{"the other at its limit", view(map[string]int{"a": 1, "one": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "one": {implement: 3}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitRun},
		{"at its limit, other work waits", view(map[string]int{"one": 1}, map[string]map[proto.Kind]int{"one": {implement: 3}, "b": {implement: 1}}), &proto.Job{Project: "one", Kind: implement}, one, true, long, admitDefer},
		{"at its limit, nothing else waits", view(map[string]int{"one": 1}, map[string]map[proto.Kind]int{"one": {implement: 3}}), &proto.Job{Project: "one", Kind: implement}, one, true, long, admitWait},
		{"at its limit, may not be deferred", view(map[string]int{"one": 1}, map[string]map[proto.Kind]int{"one": {implement: 3}, "b": {implement: 1}}), &proto.Job{Project: "one", Kind: implement}, one, false, long, admitWait},
		{"may not be deferred, room", view(map[string]int{"a": 2}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, false, long, admitRun},
		{"a higher priority of its project waits", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindRespond: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitDefer},
		{"a lower priority waits", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindCleanup: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, long, admitRun},
		{"the registry lowers respond", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindRespond: 1}}), &proto.Job{Project: "a", Kind: implement}, lowFix, true, long, admitRun},
		{"deferred enough: priority no longer defers it", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindRespond: 1}}), &proto.Job{Project: "a", Kind: implement}, a, false, long, admitRun},
	} {
		if got := judge(tc.v, tc.job, tc.p, projects, 4, tc.mayDefer, tc.turns); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// The slots as one direct get reads them are the slots a KV watch sees:
// each key in use with its value, revision and time stamp, none of the
// released ones; none at all reads as none.
func TestSlotsReadAsAWatchSeesThem(t *testing.T) {
	nc, js, locks := lockServer(t)
	ctx := context.Background()
	r := &Runner{nc: nc, locks: locks, log: zap.NewNop()}
	if slots, freed, err := r.lastSlots(ctx); err != nil || len(slots) != 0 || len(freed) != 0 {
		t.Fatalf("no slot in use: %v, %v, %v", slots, freed, err)
	}
	for _, key := range []string{slotKey("a", 0), slotKey("a", 1), slotKey("b", 0), "a.some-task"} {
		if _, err := locks.Create(ctx, key, []byte(`{"job":"`+key+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := locks.Delete(ctx, slotKey("a", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := locks.Put(ctx, slotKey("b", 0), []byte(`{"job":"refreshed"}`)); err != nil {
		t.Fatal(err)
	}
	if err := locks.Delete(ctx, "a.some-task"); err != nil {
		t.Fatal(err)
	}
	direct, freed, err := r.lastSlots(ctx, "a.some-task", "a.never-taken")
	if err != nil {
		t.Fatal(err)
	}
	watched, err := r.watchSlots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range watched {
		watched[i].created = watched[i].created.UTC()
	}
	if len(direct) != 2 || !reflect.DeepEqual(direct, watched) {
		t.Fatalf("direct get read\n%+v\na watch\n%+v\nwant slot.a.0 and slot.b.0 alike", direct, watched)
	}
	if direct[1].key != slotKey("b", 0) || string(direct[1].value) != `{"job":"refreshed"}` {
		t.Errorf("slot b.0 read as %+v, want its refreshed value", direct[1])
	}
	// The released keys, the slot's and the task lock's asked for, with
	// the revisions of their delete markers.
	want := map[string]uint64{}
	for _, key := range []string{slotKey("a", 1), "a.some-task"} {
		h, err := locks.History(ctx, key)
		if err != nil || h[len(h)-1].Operation() != jetstream.KeyValueDelete {
			t.Fatalf("history of %s: %v, %v", key, h, err)
		}
		want[key] = h[len(h)-1].Revision()
	}
	if !reflect.DeepEqual(freed, want) {
		t.Errorf("freed %v, want %v", freed, want)
	}

	// A stream that answers no direct get (a server before 2.11 answers
	// this one with an error too) is read with the watch.
	s, err := js.Stream(ctx, "KV_"+proto.BucketTaskLocks)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.lastSlots(ctx); err == nil {
		t.Fatal("a direct get answered without direct gets allowed")
	}
	slots, freed, err := r.readSlots(ctx, "a.some-task")
	if err != nil || len(slots) != 2 || freed != nil {
		t.Fatalf("slots without direct gets: %+v, freed %v, %v", slots, freed, err)
	}
}

// An admission uses the queue read beside its job's other reads only
// when this runner took and released nothing since the read went out: a
// slot it took meanwhile is never missed. A read ahead serves once.
func TestQueueReadAheadMissesNoSlot(t *testing.T) {
	nc, js, locks := lockServer(t)
	ctx := context.Background()
	jobs, err := js.Stream(ctx, proto.StreamJobs)
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{nc: nc, locks: locks, jobsStream: jobs, log: zap.NewNop(), cfg: Config{AckWait: time.Minute}}

	ahead := r.readAhead(ctx, "a.some-task")
	if _, err := locks.Create(ctx, slotKey("a", 0), []byte(`{"job":"j1","kind":"review"}`)); err != nil {
		t.Fatal(err)
	}
	r.changed()
	if v := ahead.take(r.fair.changes.Load()); v != nil {
		t.Errorf("a read from before a slot this runner took was used: %+v", v)
	}
	ahead.close()

	ahead = r.readAhead(ctx, "a.some-task")
	defer ahead.close()
	v := ahead.take(r.fair.changes.Load())
	if v == nil || v.running["a"] != 1 {
		t.Fatalf("read ahead with nothing taken since: %+v, want it used, with a's slot running", v)
	}
	if again := ahead.take(r.fair.changes.Load()); again != nil {
		t.Errorf("a read ahead served twice")
	}
}

// BenchmarkReadSlots compares the two ways of reading the slots in use
// (8 of them) that admission has, on the same server: one direct get,
// and the KV watch (a consumer created and deleted per read).
func BenchmarkReadSlots(b *testing.B) {
	nc, _, locks := lockServer(b)
	ctx := context.Background()
	for n := range 8 {
		if _, err := locks.Create(ctx, slotKey("widgets", n), []byte(`{"job":"j"}`)); err != nil {
			b.Fatal(err)
		}
	}
	r := &Runner{nc: nc, locks: locks, log: zap.NewNop()}
	for _, read := range []struct {
		name string
		f    func(context.Context) ([]slotRead, error)
	}{{"direct-get", func(ctx context.Context) ([]slotRead, error) {
		slots, _, err := r.lastSlots(ctx)
		return slots, err
	}}, {"watch", r.watchSlots}, {"one-kv-get", func(ctx context.Context) ([]slotRead, error) {
		_, err := locks.Get(ctx, slotKey("widgets", 0))
		return make([]slotRead, 8), err
	}}} {
		b.Run(read.name, func(b *testing.B) {
			for b.Loop() {
				if slots, err := read.f(ctx); err != nil || len(slots) != 8 {
					b.Fatalf("%d slots, %v", len(slots), err)
				}
			}
		})
	}
}
