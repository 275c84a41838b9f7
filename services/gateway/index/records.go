package index

import (
	"time"

	"github.com/orch-dev/orch/proto"
)

// Ref names a job whose status record the index has read, and when the
// bucket stored its latest version (which the bucket's TTL counts from).
type Ref struct {
	ID, Project, Task string
	Kind              proto.Kind
	Written           time.Time
}

// EachRecord calls f for every job whose record the index read from the
// bucket: the gateway's dedupe memory keeps a key for each
// (queue.Dedupe.Keep).
func (ix *Index) EachRecord(f func(Ref)) {
	ix.mu.RLock()
	refs := make([]Ref, 0, len(ix.byID))
	for _, el := range ix.byID {
		if r := el.Value.(*Recent); !r.written.IsZero() {
			refs = append(refs, Ref{ID: r.ID, Project: r.Project, Kind: r.Kind, Task: r.Task, Written: r.written})
		}
	}
	ix.mu.RUnlock()
	for _, ref := range refs {
		f(ref)
	}
}
