package index

import "github.com/orch-dev/orch/proto"

// Ref names a job whose status record the index has read.
type Ref struct {
	ID, Project, Task string
	Kind              proto.Kind
}

// recordsBuffer is how many first reads of records Records holds before
// it drops them (and Missed says so).
const recordsBuffer = 4096

// Records carries the jobs whose record the index read from the bucket
// for the first time: the gateway's dedupe memory keeps a key for each
// (queue.Dedupe.Keep). When its reader falls behind, the jobs that do not
// fit are dropped and Missed reports it.
func (ix *Index) Records() <-chan Ref { return ix.records }

// Missed reports, once, whether Records dropped a job since the last
// call: the reader then walks every record (EachRecord).
func (ix *Index) Missed() bool { return ix.missed.Swap(false) }

// EachRecord calls f for every job whose record the index holds.
func (ix *Index) EachRecord(f func(Ref)) {
	ix.mu.RLock()
	refs := make([]Ref, 0, len(ix.byID))
	for _, el := range ix.byID {
		if r := el.Value.(*Recent); r.seq == 0 {
			refs = append(refs, Ref{ID: r.ID, Project: r.Project, Kind: r.Kind, Task: r.Task})
		}
	}
	ix.mu.RUnlock()
	for _, ref := range refs {
		f(ref)
	}
}
