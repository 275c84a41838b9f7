package check

import (
	"reflect"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway"
)

// TestTopologyDefaultsHaveOneSource holds the two statements of each
// topology default to one value: the envDefault tags of service.Common
// (and the gateway's ORCH_DEDUPE_TTL), which are what a service ensures
// when nothing is set, and proto's constants, which a zero proto.Topology
// falls back to. Every setting must have its default in a tag, so that
// the comparison is of two values and not of proto's with itself.
func TestTopologyDefaultsHaveOneSource(t *testing.T) {
	common := service.Default[service.Common]()
	fromTags, zero := common.Topology(), proto.Topology{}
	v := reflect.ValueOf(fromTags)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("proto.Topology.%s has no default in service.Common's envDefault tags", v.Type().Field(i).Name)
		}
	}
	dedupeTTL := service.Default[gateway.Config]().DedupeTTL
	if dedupeTTL == 0 {
		t.Error("ORCH_DEDUPE_TTL has no envDefault")
	}
	streams := map[string][2]jetstream.StreamConfig{
		proto.StreamJobs:       {fromTags.JobsStream(), zero.JobsStream()},
		proto.StreamAdvisories: {fromTags.AdvisoriesStream(), zero.AdvisoriesStream()},
		proto.StreamDLQ:        {fromTags.DLQStream(), zero.DLQStream()},
		proto.StreamLogs:       {fromTags.LogsStream(), zero.LogsStream()},
	}
	for name, c := range streams {
		if !reflect.DeepEqual(c[0], c[1]) {
			t.Errorf("stream %s: the envDefault tags ask for\n%+v\nproto's defaults for\n%+v", name, c[0], c[1])
		}
	}
	buckets := map[string][2]jetstream.KeyValueConfig{
		proto.BucketJobs:       {fromTags.JobsBucket(), zero.JobsBucket()},
		proto.BucketTaskLocks:  {fromTags.TaskLocksBucket(), zero.TaskLocksBucket()},
		proto.BucketWriteback:  {fromTags.WritebackBucket(), zero.WritebackBucket()},
		proto.BucketUISessions: {fromTags.UISessionsBucket(), zero.UISessionsBucket()},
		proto.BucketDedupe:     {fromTags.DedupeBucket(dedupeTTL), zero.DedupeBucket(0)},
	}
	for name, c := range buckets {
		if !reflect.DeepEqual(c[0], c[1]) {
			t.Errorf("bucket %s: the envDefault tags ask for\n%+v\nproto's defaults for\n%+v", name, c[0], c[1])
		}
	}
}
