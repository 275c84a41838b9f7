package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// profiler samples one service process with perf while a phase runs, for
// the closing note's "where the time goes". The services expose no pprof
// endpoint, and perf needs no change to them; `perf report -i <file>` (or
// pprof after perf_to_profile) reads the result. It is a no-op without
// -profile-dir.
type profiler struct{ cmd *exec.Cmd }

func (b *bench) profile(service, phase string) *profiler {
	p, ok := b.procs[service]
	if b.o.profileDir == "" || !ok {
		return &profiler{}
	}
	out := filepath.Join(b.o.profileDir, service+"-"+phase+".perf.data")
	cmd := exec.Command("perf", "record", "-q", "-F", "999", "-g", "-p", strconv.Itoa(p.Pid()), "-o", out)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "orchbench: perf: %v\n", err)
		return &profiler{}
	}
	return &profiler{cmd: cmd}
}

func (p *profiler) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	_ = p.cmd.Wait()
}
