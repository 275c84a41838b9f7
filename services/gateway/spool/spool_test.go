package spool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

func entry(id string) *Entry {
	return &Entry{Source: "gitea", Jobs: []proto.Job{{ID: id}}}
}

// Entries come back in the order they went in, across a reopen, after a
// failure, and a torn write or a corrupt file does not block the rest.
func TestDrainInOrder(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Append(entry(id)); err != nil {
			t.Fatal(err)
		}
	}
	// A crash mid-write leaves a .tmp; a bad disk a garbled entry.
	if err := os.WriteFile(filepath.Join(dir, fileName(99, "tmp")), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fileName(4, "json")), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir) // as after a restart
	if err != nil {
		t.Fatal(err)
	}
	if s.Depth() != 4 {
		t.Fatalf("depth %d, want 4", s.Depth())
	}
	if seq, err := s.Append(entry("d")); err != nil || seq != 100 {
		t.Fatalf("append after reopen: seq %d, %v; want 100", seq, err)
	}

	var mu sync.Mutex
	var got []string
	failOnce := true
	handle := func(_ context.Context, e *Entry) error {
		mu.Lock()
		defer mu.Unlock()
		if e.Jobs[0].ID == "b" && failOnce {
			failOnce = false
			return errors.New("jetstream away")
		}
		got = append(got, e.Jobs[0].ID)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, handle, 10*time.Millisecond, zaptest.NewLogger(t)) }()
	defer func() { cancel(); <-done }()
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if s.Depth() != 0 {
			return errors.New("spool not drained")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a", "b", "c", "d"}; !equal(got, want) {
		t.Errorf("drained %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, QuarantineDirName, fileName(4, "json"))); err != nil {
		t.Errorf("corrupt entry not quarantined: %v", err)
	}
	if n := s.Quarantined(); n != 1 {
		t.Errorf("%d entries counted quarantined, want 1", n)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName(99, "tmp"))); !os.IsNotExist(err) {
		t.Errorf("torn write left behind: %v", err)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An entry its handler fails for good goes to the quarantine, with why,
// and the entries behind it are carried out; OldestAge follows the head.
func TestPermanentFailureIsQuarantined(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.OldestAge() != 0 {
		t.Errorf("empty spool has oldest age %v", s.OldestAge())
	}
	old := entry("never")
	old.SpooledAt = time.Now().Add(-time.Hour)
	for _, e := range []*Entry{old, entry("after")} {
		if _, err := s.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if age := s.OldestAge(); age < 59*time.Minute {
		t.Errorf("oldest age %v, want about an hour", age)
	}
	var mu sync.Mutex
	var got []string
	handle := func(_ context.Context, e *Entry) error {
		if e.Jobs[0].ID == "never" {
			return errors.Join(ErrPermanent, errors.New("nats: maximum payload exceeded"))
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e.Jobs[0].ID)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// A retry an hour away: only a quarantine that moves on at once
	// drains the second entry within the test.
	go func() { defer close(done); s.Run(ctx, handle, time.Hour, zaptest.NewLogger(t)) }()
	defer func() { cancel(); <-done }()
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if s.Depth() != 0 {
			return errors.New("spool not drained")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if !equal(got, []string{"after"}) {
		t.Errorf("carried out %v, want [after]", got)
	}
	if s.Quarantined() != 1 || s.OldestAge() != 0 {
		t.Errorf("quarantined %d, oldest age %v; want 1 and 0", s.Quarantined(), s.OldestAge())
	}
	why, err := os.ReadFile(filepath.Join(s.QuarantineDir(), fileName(1, "err")))
	if err != nil || !strings.Contains(string(why), "maximum payload") {
		t.Errorf("quarantine reason %q (%v)", why, err)
	}
	if _, err := s.Read(1); err == nil {
		t.Error("quarantined entry still in the spool")
	}
}
