package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/orch-dev/orch/services/runner/sandbox/initproc"
)

// A sandbox's init and the rlimits step are package initproc's, which
// any binary that links this package links too.
const (
	initEnv     = initproc.InitEnv
	probeValue  = initproc.ProbeValue
	probeAnswer = initproc.ProbeAnswer
)

// initSpec is what init is to do besides starting the agent.
type initSpec = initproc.Spec

// InitName is the file name of orch's own init program
// (cmd/orch-sandbox-init), which FindInit looks for beside the runner's
// executable.
const InitName = "orch-sandbox-init"

// initProbeTimeout bounds the trial of an init program at start.
const initProbeTimeout = 10 * time.Second

// FindInit returns the program every sandbox's init (and the rlimits
// step) runs as, and, when one was passed over, a note saying why.
//
// named (ORCH_AGENT_SANDBOX_INIT), when set, is that program: an error
// when it does not answer the probe as this runner expects. Else it is
// InitName beside exe, the runner's executable, when it is there and
// answers; else exe itself, which serves as init just as well but starts
// slower (package initproc). A program that answers otherwise was built
// from another revision of what the runner hands init (initproc's
// ProbeAnswer), and is passed over with the note.
func FindInit(ctx context.Context, named, exe string) (init, note string, err error) {
	if named != "" {
		if err := probeInit(ctx, named); err != nil {
			return "", "", fmt.Errorf("ORCH_AGENT_SANDBOX_INIT: %w", err)
		}
		return named, "", nil
	}
	if exe == "" {
		return "", "", nil // unconfined, the runner's executable not found
	}
	beside := filepath.Join(filepath.Dir(exe), InitName)
	if _, err := os.Stat(beside); errors.Is(err, os.ErrNotExist) {
		return exe, "", nil
	}
	if err := probeInit(ctx, beside); err != nil {
		return exe, fmt.Sprintf("%v; the runner's own executable serves as init instead", err), nil
	}
	return beside, "", nil
}

// probeInit runs path in init's probe mode, outside any sandbox, and
// says what is wrong when it does not answer as this runner's init does.
func probeInit(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, initProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{initEnv + "=" + probeValue}
	out, err := cmd.Output()
	answer := strings.TrimSpace(string(out))
	switch {
	case err != nil:
		return fmt.Errorf("init program %s does not run: %w", path, err)
	case answer != probeAnswer:
		return fmt.Errorf("init program %s answered %q, not %q: built from another revision of orch? install the one built with this runner", path, answer, probeAnswer)
	}
	return nil
}
