// Package trigger turns a verified webhook delivery into the jobs it asks
// for. It is pure: no I/O, so the whole trigger table is table-tested.
package trigger

import (
	"fmt"
	"strings"
	"time"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/registry"
)

// Decision is what one delivery asks for. Exactly one of Jobs, Cancel or
// Ignored is set.
type Decision struct {
	// Jobs to queue.
	Jobs []proto.Job
	// Cancel names a task whose open jobs are to be cancelled.
	Cancel *Cancel
	// Ignored says why nothing is queued.
	Ignored string
}

// Cancel asks for the open jobs of one task to be cancelled.
type Cancel struct {
	Project string
	Task    string
	// RemoveWorktree is set when the task is over (its pull request closed).
	RemoveWorktree bool
}

// Ignore is a Decision that queues nothing, for the reason given.
func Ignore(format string, args ...any) Decision {
	return Decision{Ignored: fmt.Sprintf(format, args...)}
}

// AgentBranchPrefix starts the branch of every agent task: agent/<task>.
const AgentBranchPrefix = "agent/"

// TaskOfBranch returns the task of an agent branch, and false for any
// other branch.
func TaskOfBranch(branch string) (string, bool) {
	rest, ok := strings.CutPrefix(branch, AgentBranchPrefix)
	if !ok || rest == "" {
		return "", false
	}
	return proto.Token(rest), true
}

// newJob builds a job whose id follows from key, so that a repeated event
// names the same job.
func newJob(p *registry.Project, kind proto.Kind, key string, task proto.Task, src proto.Source, now time.Time) proto.Job {
	return proto.Job{
		Schema:    proto.SchemaVersion,
		ID:        proto.JobID(p.Key + "|" + string(kind) + "|" + key),
		Kind:      kind,
		Project:   p.Key,
		Task:      task,
		Source:    src,
		CreatedAt: now.UTC(),
	}
}
