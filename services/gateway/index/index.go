// Package index is the gateway's in-memory view of the status bucket,
// kept current by a KV watch: counts per state and the recent list for
// GET /queue, and each task's open jobs for cancelling a task.
package index

import (
	"container/list"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/backoff"
	"github.com/orch-dev/orch/kit/service"
	"github.com/orch-dev/orch/proto"
)

// Index is an in-memory view of the status bucket, kept current by a KV
// watch, so that GET /queue costs the same at any queue depth: counts are
// kept per state and per project as records change, and the recent list is
// the front of a list ordered by last change.
type Index struct {
	mu     sync.RWMutex
	byID   map[string]*list.Element
	byTask map[taskKey]map[string]struct{} // ids of each task's jobs that have not ended
	byItem map[taskKey]map[string]struct{} // job ids of each Plane work item
	recent *list.List                      // of *Recent, most recently changed first
	counts map[proto.State]int
	// byProject counts each project's jobs per state; a state a project
	// has no job in is absent, and so is a project with no job.
	byProject map[string]map[proto.State]int
	// synced and jobsSynced say the status bucket and JOBS were read
	// whole once.
	synced, jobsSynced bool
	// waiting holds the jobs known from JOBS alone (see Queued).
	waiting map[string]*Recent
	// own holds the JOBS sequences this gateway published (Queued) from
	// next on, the first that FollowJobs has not read.
	own  map[uint64]struct{}
	next uint64
}

// Recent is one line of GET /queue's recent list. Title is the task's
// title, where its event gave one: the jobs of one pull request share its
// task id.
type Recent struct {
	ID        string      `json:"id"`
	Kind      proto.Kind  `json:"kind"`
	Project   string      `json:"project"`
	Task      string      `json:"task"`
	Title     string      `json:"title,omitempty"`
	State     proto.State `json:"state"`
	Attempt   int         `json:"attempt"`
	UpdatedAt time.Time   `json:"updated_at"`
	Runner    string      `json:"runner,omitempty"`
	CostUSD   float64     `json:"cost_usd,omitempty"`
	CreatedAt time.Time   `json:"created_at,omitzero"`
	// written is when the bucket stored this version of the record: the
	// bucket expires it TTL later.
	written time.Time
	// planeItem is the job's Plane work item id, if it has one.
	planeItem string
	// seq is the job's sequence in JOBS while the index knows the job
	// from there alone (see Queued), since when it knows it; seq is 0
	// once its record was read.
	seq   uint64
	since time.Time
}

type taskKey struct{ project, task string }

// New returns an empty index.
func New() *Index {
	return &Index{
		byID: map[string]*list.Element{}, byTask: map[taskKey]map[string]struct{}{}, byItem: map[taskKey]map[string]struct{}{},
		recent: list.New(), counts: map[proto.State]int{}, byProject: map[string]map[proto.State]int{},
		waiting: map[string]*Recent{}, own: map[uint64]struct{}{},
	}
}

// Watch follows the bucket until ctx ends, restarting the watch when it
// breaks (a NATS outage, say) and when the connection reconnects (rc may
// be nil): the watch's consumer may have gone with a server.
func (ix *Index) Watch(ctx context.Context, kv jetstream.KeyValue, rc *service.Reconnects, log *zap.Logger) {
	for ctx.Err() == nil {
		if err := ix.watchOnce(ctx, kv, rc.Next(), log); err != nil && ctx.Err() == nil {
			log.Warn("watching job status, will retry", zap.Error(err))
			backoff.Sleep(ctx, time.Second)
		}
	}
}

// watchOnce reads the whole bucket and then follows it until the watch
// breaks or ctx ends. A watch started again (after a NATS outage) drops
// the records the bucket no longer holds: deletes and expiries that
// happened while nobody watched. Records the bucket expires while watched
// leave no trace in the watch, so they are swept by their age.
func (ix *Index) watchOnce(ctx context.Context, kv jetstream.KeyValue, reconnected <-chan struct{}, log *zap.Logger) error {
	var ttl time.Duration
	if st, err := kv.Status(ctx); err == nil {
		ttl = st.TTL()
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer w.Stop()
	seen := map[string]struct{}{} // keys of the initial values; nil after them
	sweep := time.NewTicker(sweepEvery(ttl))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reconnected:
			log.Info("nats reconnected: reading the status bucket again")
			return nil
		case <-sweep.C:
			if ttl > 0 {
				ix.expire(time.Now().Add(-ttl))
			}
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil { // the initial values have been delivered
				ix.keepOnly(seen)
				seen = nil
				ix.mu.Lock()
				ix.synced = true
				ix.mu.Unlock()
				continue
			}
			if seen != nil {
				seen[e.Key()] = struct{}{}
			}
			if e.Operation() != jetstream.KeyValuePut {
				ix.remove(e.Key())
				continue
			}
			st, err := proto.DecodeStatus(e.Value())
			if err != nil {
				log.Warn("undecodable status record", zap.String("job", e.Key()), zap.Error(err))
				continue
			}
			ix.put(st, e.Created())
		}
	}
}

// sweepEvery is how often records past ttl are looked for: often enough
// that GET /queue agrees with the bucket within a second of an expiry for
// short TTLs, rarely for the default of days.
func sweepEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/100, 500*time.Millisecond), time.Minute)
}

// keepOnly removes every record whose key is not in keys (the jobs known
// from JOBS alone stay).
func (ix *Index) keepOnly(keys map[string]struct{}) {
	ix.mu.RLock()
	var gone []string
	for id, el := range ix.byID {
		if _, ok := keys[id]; !ok && el.Value.(*Recent).seq == 0 {
			gone = append(gone, id)
		}
	}
	ix.mu.RUnlock()
	for _, id := range gone {
		ix.remove(id)
	}
}

// expire removes the records written before cutoff: the bucket has
// expired them. The recent list is in order of change, so they are at its
// back, behind the jobs known from JOBS alone, which no TTL expires.
func (ix *Index) expire(cutoff time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for el := ix.recent.Back(); el != nil; {
		r := el.Value.(*Recent)
		el = el.Prev()
		switch {
		case r.seq != 0:
		case !r.written.IsZero() && r.written.Before(cutoff):
			ix.removeLocked(r.ID)
		default:
			return
		}
	}
}

// Has reports whether the index knows job id: by its record, or from
// JOBS.
func (ix *Index) Has(id string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	_, ok := ix.byID[id]
	return ok
}

// Put records st as the job's current state.
func (ix *Index) Put(st *proto.Status) { ix.put(st, time.Time{}) }

// put records st, which the bucket stored at written (zero: unknown).
func (ix *Index) put(st *proto.Status, written time.Time) {
	r := &Recent{
		ID: st.Job.ID, Kind: st.Job.Kind, Project: st.Job.Project, Task: st.Job.Task.ID, Title: st.Job.Task.Title,
		State: st.State, Attempt: st.Attempt, UpdatedAt: st.UpdatedAt,
		Runner: st.Runner, CostUSD: st.CostUSD, CreatedAt: st.Job.CreatedAt, written: written,
		planeItem: st.Job.Task.PlaneItem,
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.removeLocked(r.ID)
	ix.add(r)
}

// add puts r, a job the index does not hold, at the front. The caller
// holds mu.
func (ix *Index) add(r *Recent) {
	ix.count(r, 1)
	ix.byID[r.ID] = ix.recent.PushFront(r)
	if r.seq != 0 {
		ix.waiting[r.ID] = r
	}
	// A task's ended jobs stay in the index until the bucket expires
	// them; its open jobs, which every webhook's supersede looks up, are
	// a few.
	if k := (taskKey{r.Project, r.Task}); !r.State.Terminal() {
		if ix.byTask[k] == nil {
			ix.byTask[k] = map[string]struct{}{}
		}
		ix.byTask[k][r.ID] = struct{}{}
	}
	if r.planeItem != "" {
		k := taskKey{r.Project, r.planeItem}
		if ix.byItem[k] == nil {
			ix.byItem[k] = map[string]struct{}{}
		}
		ix.byItem[k][r.ID] = struct{}{}
	}
}

// count adds d to r's state's counts, the whole index's and its
// project's. The caller holds mu.
func (ix *Index) count(r *Recent, d int) {
	ix.counts[r.State] += d
	pc := ix.byProject[r.Project]
	if pc == nil {
		pc = map[proto.State]int{}
		ix.byProject[r.Project] = pc
	}
	if pc[r.State] += d; pc[r.State] == 0 {
		delete(pc, r.State)
	}
	if len(pc) == 0 {
		delete(ix.byProject, r.Project)
	}
}

func (ix *Index) remove(id string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.removeLocked(id)
}

// removeLocked removes job id. The caller holds mu.
func (ix *Index) removeLocked(id string) {
	if el, ok := ix.byID[id]; ok {
		r := el.Value.(*Recent)
		ix.count(r, -1)
		ix.recent.Remove(el)
		delete(ix.byID, id)
		delete(ix.waiting, id)
		k := taskKey{r.Project, r.Task}
		delete(ix.byTask[k], id)
		if len(ix.byTask[k]) == 0 {
			delete(ix.byTask, k)
		}
		if r.planeItem != "" {
			k := taskKey{r.Project, r.planeItem}
			delete(ix.byItem[k], id)
			if len(ix.byItem[k]) == 0 {
				delete(ix.byItem, k)
			}
		}
	}
}

// PlaneTask returns the task name the project's jobs of a Plane work item
// carry, if the index holds any: the gateway names a work item's later
// events by it, so that one item is never two tasks (see planenames).
func (ix *Index) PlaneTask(project, item string) (string, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for id := range ix.byItem[taskKey{project, item}] {
		return ix.byID[id].Value.(*Recent).Task, true
	}
	return "", false
}

// OpenJobs returns the ids of the task's jobs that have not ended.
func (ix *Index) OpenJobs(project, task string) []string {
	return ix.openJobs(project, task, func(*Recent) bool { return true })
}

// OlderOpenJobs returns the ids of the task's jobs of kind that have not
// ended and were created before t: the ones a new job of that kind may
// supersede.
func (ix *Index) OlderOpenJobs(project, task string, kind proto.Kind, t time.Time) []string {
	return ix.openJobs(project, task, func(r *Recent) bool { return r.Kind == kind && r.CreatedAt.Before(t) })
}

// openJobs returns, sorted, the ids of the task's jobs that have not
// ended and that match.
func (ix *Index) openJobs(project, task string, match func(*Recent) bool) []string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []string
	for id := range ix.byTask[taskKey{project, task}] {
		if r := ix.byID[id].Value.(*Recent); match(r) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Counts returns the number of jobs in each state, every state present.
func (ix *Index) Counts() map[proto.State]int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make(map[proto.State]int, len(proto.States))
	for _, s := range proto.States {
		out[s] = ix.counts[s]
	}
	return out
}

// ProjectCounts returns, per project with a job in the index, the number
// of its jobs in each state (only the states it has).
func (ix *Index) ProjectCounts() map[string]map[proto.State]int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make(map[string]map[proto.State]int, len(ix.byProject))
	for p, pc := range ix.byProject {
		out[p] = maps.Clone(pc)
	}
	return out
}

// Recent returns up to limit jobs, most recently changed first.
func (ix *Index) Recent(limit int) []Recent {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]Recent, 0, min(limit, ix.recent.Len()))
	for el := ix.recent.Front(); el != nil && len(out) < limit; el = el.Next() {
		out = append(out, *el.Value.(*Recent))
	}
	return out
}

// RecordsRead reports whether the index has read the whole bucket once.
func (ix *Index) RecordsRead() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.synced
}

// Synced reports whether the index has read the whole bucket and the
// whole of JOBS once.
func (ix *Index) Synced() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.synced && ix.jobsSynced
}
