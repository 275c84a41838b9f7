package queue

import (
	"sync"

	"github.com/orch-dev/orch/proto"
)

// recentBytes bounds the jobs recent keeps, by the size of their
// encodings: about five hundred review jobs of a usual size.
const recentBytes = 1 << 20

// recent holds the jobs this gateway published last, as it published
// them, so that the gateway's own writes about a job still waiting in JOBS
// without a record (its supersede by a newer job of the task, the record
// created for it after RecordAfter: see current) need not read it back
// from JOBS first. Most supersedes come within a minute of the older
// job's publish, by the gateway that published it. A job recent no longer
// holds (pushed out by newer ones, or published by another gateway) is
// read from JOBS as before; a job that has its record is never looked up
// here (the index says it is not waiting).
type recent struct {
	mu    sync.Mutex
	jobs  map[string]recentJob
	order []string // ids, oldest first
	bytes int
}

type recentJob struct {
	job  *proto.Job
	size int
}

// add keeps job, whose encoding JOBS holds at size bytes, pushing out the
// oldest jobs past recentBytes. job must not change afterwards.
func (r *recent) add(job *proto.Job, size int) {
	if size > recentBytes {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.jobs == nil {
		r.jobs = map[string]recentJob{}
	}
	if _, ok := r.jobs[job.ID]; ok {
		return
	}
	r.jobs[job.ID] = recentJob{job: job, size: size}
	r.order = append(r.order, job.ID)
	r.bytes += size
	for r.bytes > recentBytes {
		old := r.order[0]
		r.order[0] = ""
		r.order = r.order[1:]
		r.bytes -= r.jobs[old].size
		delete(r.jobs, old)
	}
}

// get returns the job id as published, if it is kept.
func (r *recent) get(id string) (*proto.Job, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[id]
	return j.job, ok
}
