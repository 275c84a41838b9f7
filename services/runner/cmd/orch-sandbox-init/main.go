// Command orch-sandbox-init is the init of a confined agent's sandbox:
// the process bubblewrap starts, which serves the forwarder to the job's
// egress proxy and runs the agent (package initproc). The runner runs it
// when it finds it beside its own executable (or where
// ORCH_AGENT_SANDBOX_INIT names it) and it answers the runner's probe;
// else the runner's own executable serves as init, which costs about 9 ms
// more on each confined job's start (a 22 MB program's start against a
// 1.7 MB one's). Install it with the runner; it is not run by hand.
package main

import (
	"os"

	// Its init function is the whole program, when the runner starts it.
	_ "github.com/orch-dev/orch/services/runner/sandbox/initproc"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "-version" || os.Args[1] == "--version") {
		_, _ = os.Stdout.WriteString("orch-sandbox-init " + version + "\n")
		return
	}
	_, _ = os.Stderr.WriteString("orch-sandbox-init is the init of the runner's agent sandboxes: the runner starts it, inside bubblewrap; it is not run by hand" + "\n")
	os.Exit(2)
}
