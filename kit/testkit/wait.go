package testkit

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/natstest"
)

// WaitGone waits until alive reports none of pids alive, and fails the
// test after 20 seconds.
func WaitGone(t testing.TB, alive func(pid int) bool, pids ...int) {
	t.Helper()
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		for _, pid := range pids {
			if alive(pid) {
				return fmt.Errorf("process %d is still alive", pid)
			}
		}
		return nil
	})
}

// Ready polls base+"/readyz" until it answers 200 OK, and fails the test
// when timeout passes first.
func Ready(t testing.TB, client *http.Client, base string, timeout time.Duration) {
	t.Helper()
	WaitOK(t, client, base+"/readyz", timeout)
}

// ReadyErr asks base+"/readyz" once: nil when it answers 200 OK.
func ReadyErr(client *http.Client, base string) error { return OK(client, base+"/readyz") }

// WaitOK polls url until it answers 200 OK, and fails the test when
// timeout passes first.
func WaitOK(t testing.TB, client *http.Client, url string, timeout time.Duration) {
	t.Helper()
	natstest.CheckFor(t, timeout, 50*time.Millisecond, func() error { return OK(client, url) })
}

// OK gets url once (with http.DefaultClient when client is nil): nil when
// it answers 200 OK.
func OK(client *http.Client, url string) error {
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", url, resp.Status, body)
	}
	return nil
}

// ReadPid waits for the file at path to hold a process id (an agent
// script writes "echo $$ > file") and returns it.
func ReadPid(t testing.TB, path string) int {
	t.Helper()
	var pid int
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err
	})
	return pid
}
