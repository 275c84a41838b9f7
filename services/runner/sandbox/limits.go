package sandbox

import "github.com/orch-dev/orch/services/runner/sandbox/initproc"

// Limits bound an agent: rlimits, set by a step of their own between init
// (or the supervisor, unconfined) and the agent (package initproc).
type Limits = initproc.Limits
