package index

import "github.com/orch-dev/orch/proto"

// Filter picks jobs of the index; an empty field matches every job.
type Filter struct {
	State   proto.State
	Project string
	Kind    proto.Kind
}

func (f Filter) match(r *Recent) bool {
	return (f.State == "" || r.State == f.State) && (f.Project == "" || r.Project == f.Project) &&
		(f.Kind == "" || r.Kind == f.Kind)
}

// List returns the jobs that match f, most recently changed first, from
// offset on and at most limit of them, with the number that match in all.
// It walks the whole index, which is fine for a page a person asks for
// every few seconds; GET /queue keeps its constant cost by not filtering.
func (ix *Index) List(f Filter, offset, limit int) ([]Recent, int) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []Recent
	total := 0
	for el := ix.recent.Front(); el != nil; el = el.Next() {
		r := el.Value.(*Recent)
		if !f.match(r) {
			continue
		}
		if total >= offset && len(out) < limit {
			out = append(out, *r)
		}
		total++
	}
	return out, total
}
