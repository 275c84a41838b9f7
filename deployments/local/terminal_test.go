package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/orch-dev/orch/kit/natstest"
)

// runInTerminal runs bin with args in a pseudo-terminal, as a person at a
// terminal would (`nats stream view` pages only there), and returns what
// it printed. A command that keeps running (watch) is stopped with Ctrl-C
// once its output holds every string of want; any other must exit 0 by
// itself. An interactive "Next Page?" is answered no.
func runInTerminal(t *testing.T, bin string, args, env []string, keepsRunning bool, want []string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 200})
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			_, _ = out.Write(buf[:n])
			if err != nil {
				return // EIO once the command has exited
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = tty.Close()
		<-read
	}()

	deadline := time.After(2 * time.Minute)
	answered := 0
	if keepsRunning {
		natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			for _, w := range want {
				if !strings.Contains(out.String(), w) {
					return errors.New("output lacks " + w + " so far:\n" + out.String())
				}
			}
			return nil
		})
		_, _ = tty.Write([]byte{3}) // Ctrl-C
		select {
		case <-exited:
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("%s did not stop on Ctrl-C:\n%s", args, out.String())
		}
		return out.String()
	}
	for {
		select {
		case err := <-exited:
			<-read
			if err != nil {
				t.Errorf("nats %s: %v\n%s", strings.Join(args, " "), err, out.String())
			}
			return out.String()
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("nats %s did not end:\n%s", strings.Join(args, " "), out.String())
		case <-time.After(100 * time.Millisecond):
			if n := strings.Count(out.String(), "Next Page?"); n > answered {
				answered = n
				_, _ = tty.Write([]byte("n\r"))
			}
		}
	}
}
