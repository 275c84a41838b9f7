package agent

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orch-dev/orch/kit/natstest"
)

// The gate opens by the runner's byte alone: while the agent waits at it,
// its supervisor holds a write end of the gate's pipe too, so that the
// runner's end of file (its death, when its own end closes) is not read
// at the gate before the supervisor has killed the sandbox.
func TestSupervisorHoldsTheGate(t *testing.T) {
	p := NewPool(1, 1, nil)
	defer p.Close()
	dir := t.TempDir()
	st, err := p.Prestart(Spec{Argv: []string{"sh", "-c", "head -c 1 <&3 >/dev/null; exit 0"}, Dir: dir,
		Env: Env(EnvAllowDefault), Gated: true, LogPath: filepath.Join(dir, "1.log"), Drained: func() {}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort()
	var gate syscall.Stat_t
	if err := syscall.Fstat(int(st.gate.Fd()), &gate); err != nil {
		t.Fatal(err)
	}
	sup := st.sup.cmd.Process.Pid
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if !holdsWriteEnd(sup, gate.Ino) {
			return fmt.Errorf("supervisor %d holds no write end of the gate pipe:[%d]", sup, gate.Ino)
		}
		return nil
	})
}

// holdsWriteEnd reports whether process pid has a descriptor open for
// writing on the pipe of inode ino.
func holdsWriteEnd(pid int, ino uint64) bool {
	fds := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, _ := os.ReadDir(fds)
	for _, e := range entries {
		if link, _ := os.Readlink(filepath.Join(fds, e.Name())); link != "pipe:["+strconv.FormatUint(ino, 10)+"]" {
			continue
		}
		info, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "fdinfo", e.Name()))
		for _, line := range strings.Split(string(info), "\n") {
			if flags, ok := strings.CutPrefix(line, "flags:"); ok {
				if f, err := strconv.ParseInt(strings.TrimSpace(flags), 8, 64); err == nil && int(f)&syscall.O_ACCMODE == syscall.O_WRONLY {
					return true
				}
			}
		}
	}
	return false
}

// An order is taken only with the descriptors it says it comes with: the
// agent's two streams, and for a gated one the gate's two ends and its
// files. A supervisor told otherwise refuses it rather than hand the
// command the wrong descriptors.
func TestReceiveCountsTheDescriptors(t *testing.T) {
	for _, c := range []struct {
		o   order
		fds int
		ok  bool
	}{
		{order{Argv: []string{"a"}}, 2, true},
		{order{Argv: []string{"a"}, Gated: true}, 4, true},
		{order{Argv: []string{"a"}, Gated: true, Files: 1}, 5, true},
		{order{Argv: []string{"a"}, Gated: true, Files: 1}, 4, false},
		{order{Argv: []string{"a"}, Gated: true}, 5, false},
		{order{Argv: []string{"a"}, Files: 1}, 3, false},
		{order{Argv: []string{"a"}, Gated: true, Files: -1}, 3, false},
		{order{Argv: []string{"a"}}, 1, false},
	} {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs := os.NewFile(uintptr(pair[0]), "ours"), os.NewFile(uintptr(pair[1]), "theirs")
		body, _ := json.Marshal(c.o)
		passed := make([]int, c.fds)
		for i := range passed {
			passed[i] = int(ours.Fd()) // any descriptor will do
		}
		msg := append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
		if err := unix.Sendmsg(int(ours.Fd()), msg, unix.UnixRights(passed...), nil, 0); err != nil {
			t.Fatal(err)
		}
		_, files, err := receive(theirs)
		for _, fd := range files {
			_ = unix.Close(fd)
		}
		if (err == nil) != c.ok {
			t.Errorf("order %+v with %d descriptors: err %v, want taken %t", c.o, c.fds, err, c.ok)
		}
		_ = ours.Close()
		_ = theirs.Close()
	}
}
