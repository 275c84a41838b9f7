package sandbox

import "github.com/orch-dev/orch/services/runner/sandbox/initproc"

// A sandbox's init and the rlimits step are package initproc's, which
// any binary that links this package links too.
const (
	initEnv     = initproc.InitEnv
	probeValue  = initproc.ProbeValue
	probeAnswer = initproc.ProbeAnswer
)

// initSpec is what init is to do besides starting the agent.
type initSpec = initproc.Spec
