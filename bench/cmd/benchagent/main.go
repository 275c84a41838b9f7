// Command benchagent is the no-op agent of `make bench`: it appends one
// line "<job id> <attempt> <unix nanoseconds at start>" to the file named
// by its first argument and exits 0. A line is written with one append of
// less than PIPE_BUF bytes, so concurrent agents never interleave.
package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	start := time.Now()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchagent <record file>")
		os.Exit(2)
	}
	f, err := os.OpenFile(os.Args[1], os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	line := fmt.Sprintf("%s %s %d\n", os.Getenv("ORCH_JOB_ID"), os.Getenv("ORCH_ATTEMPT"), start.UnixNano())
	if _, err := f.WriteString(line); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
