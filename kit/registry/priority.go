package registry

import "github.com/orch-dev/orch/proto"

// The values of Project.Priority.
const (
	PriorityHigh   = "high"
	PriorityNormal = "normal"
	PriorityLow    = "low"
)

// PriorityOf ranks kind within the project: 2 high, 1 normal, 0 low. A
// queued job is known by its subject, jobs.<project>.<kind>, before any
// runner reads it, so priority goes by kind. Without a registry entry,
// what a person asks for most (respond: a mention; review: a review
// request) is high, implement and fix are normal, cleanup is low.
func (p *Project) PriorityOf(kind proto.Kind) int {
	switch p.Priority[string(kind)] {
	case PriorityHigh:
		return 2
	case PriorityNormal:
		return 1
	case PriorityLow:
		return 0
	}
	switch kind {
	case proto.KindRespond, proto.KindReview:
		return 2
	case proto.KindCleanup:
		return 0
	}
	return 1
}
