package runner

import (
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
)

// judge's rows: limits first, then fair share (fewer running, then the
// round-robin's turn), then priority; a job that may not be deferred runs
// when its project has room and waits when it has none.
func TestJudge(t *testing.T) {
	a := &registry.Project{Key: "a"}
	b := &registry.Project{Key: "b"}
	one := &registry.Project{Key: "one", MaxConcurrency: 1}
	lowFix := &registry.Project{Key: "a", Priority: map[string]string{"respond": "low"}}
	projects := []*registry.Project{a, b, one}
	t0 := time.Now()
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
		served   map[string]time.Time
		want     admission
	}{
		{"nothing else waits", view(map[string]int{"a": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}}), &proto.Job{Project: "a", Kind: implement}, a, true, nil, admitRun},
		{"another project with fewer running waits", view(map[string]int{"a": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, nil, admitDefer},
		{"another with more running waits", view(map[string]int{"a": 0, "b": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, nil, admitRun},
		{"as many running, the other's turn", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, map[string]time.Time{"a": t0}, admitDefer},
		{"as many running, its own turn", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, map[string]time.Time{"b": t0}, admitRun},
		{"the other at its limit", view(map[string]int{"a": 1, "one": 1}, map[string]map[proto.Kind]int{"a": {implement: 5}, "one": {implement: 3}}), &proto.Job{Project: "a", Kind: implement}, a, true, nil, admitRun},
		{"at its limit, other work waits", view(map[string]int{"one": 1}, map[string]map[proto.Kind]int{"one": {implement: 3}, "b": {implement: 1}}), &proto.Job{Project: "one", Kind: implement}, one, true, nil, admitDefer},
		{"at its limit, nothing else waits", view(map[string]int{"one": 1}, map[string]map[proto.Kind]int{"one": {implement: 3}}), &proto.Job{Project: "one", Kind: implement}, one, true, nil, admitWait},
		{"at its limit, may not be deferred", view(map[string]int{"one": 1}, map[string]map[proto.Kind]int{"one": {implement: 3}, "b": {implement: 1}}), &proto.Job{Project: "one", Kind: implement}, one, false, nil, admitWait},
		{"may not be deferred, room", view(map[string]int{"a": 2}, map[string]map[proto.Kind]int{"a": {implement: 5}, "b": {implement: 1}}), &proto.Job{Project: "a", Kind: implement}, a, false, nil, admitRun},
		{"a higher priority of its project waits", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindRespond: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, nil, admitDefer},
		{"a lower priority waits", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindCleanup: 1}}), &proto.Job{Project: "a", Kind: implement}, a, true, nil, admitRun},
		{"the registry lowers respond", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindRespond: 1}}), &proto.Job{Project: "a", Kind: implement}, lowFix, true, nil, admitRun},
		{"deferred enough: priority no longer defers it", view(map[string]int{}, map[string]map[proto.Kind]int{"a": {implement: 5, proto.KindRespond: 1}}), &proto.Job{Project: "a", Kind: implement}, a, false, nil, admitRun},
	} {
		if got := judge(tc.v, tc.job, tc.p, projects, 4, tc.mayDefer, tc.served); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
