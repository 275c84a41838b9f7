package status

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/proto"
)

// TestLifecycle applies every transition to a record in every state, of
// the same attempt and of a later one, and checks the state it leads to
// or the refusal.
func TestLifecycle(t *testing.T) {
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	o := Outcome{Attempt: 2, MaxAttempts: 3, Runner: "r1", FinishedAt: now, ExitCode: 1, Err: "boom"}
	transitions := []Transition{
		Queue(3),
		StartAttempt(2, 3, "r1", "/log", now),
		Progress(2, func(st *proto.Status) { st.Turns = 9 }),
		Finish(o), Retry(o), Fail(o), Requeue(o),
		Reject(2, 3, "r1", "unknown project", now),
		Cancel(),
		Supersede("newer", true),
		Hold(2, "r1", proto.HoldOverBudget, time.Time{}, now),
		Release(""),
		Stopped(2, "r1", -1, now),
		DeadLetter(3, 7, now),
		MarkAlerted(),
	}
	const (
		q, ru, re  = proto.StateQueued, proto.StateRunning, proto.StateRetrying
		he         = proto.StateHeld
		do, fa, ca = proto.StateDone, proto.StateFailed, proto.StateCancelled
	)
	// want[transition][state] is the state after the transition, or the
	// refusal, for a record of attempt 2 (the transition's own).
	type cell = any
	states := []proto.State{absent, q, he, ru, re, do, fa, ca}
	want := map[string][]cell{
		//                 absent       queued        held           running        retrying       done         failed       cancelled
		"queue":         {q, ErrExists, ErrExists, ErrExists, ErrExists, ErrExists, ErrExists, ErrExists},
		"start attempt": {ru, ru, ru, ru, ru, ErrTerminal, ErrTerminal, ErrTerminal},
		"progress":      {ErrNotRunning, ErrNotRunning, ErrNotRunning, ru, ErrNotRunning, ErrTerminal, ErrTerminal, ErrTerminal},
		"finish":        {do, do, do, do, do, ErrTerminal, ErrTerminal, ErrTerminal},
		"retry":         {re, re, re, re, re, ErrTerminal, ErrTerminal, ErrTerminal},
		"fail":          {fa, fa, fa, fa, fa, ErrTerminal, ErrTerminal, ErrTerminal},
		"requeue":       {q, q, q, q, q, ErrTerminal, ErrTerminal, ErrTerminal},
		"reject":        {fa, fa, fa, fa, fa, ErrTerminal, ErrTerminal, ErrTerminal},
		"cancel":        {ca, ca, ca, ca, ca, ErrTerminal, ErrTerminal, ErrTerminal},
		"supersede":     {ca, ca, ca, ca, ca, ErrTerminal, ErrTerminal, ErrTerminal},
		"hold":          {he, he, he, he, he, ErrTerminal, ErrTerminal, ErrTerminal},
		"release":       {ErrNotFound, ErrNotHeld, q, ErrNotHeld, ErrNotHeld, ErrNotHeld, ErrNotHeld, ErrNotHeld},
		"stopped":       {ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ca},
		"dead-letter":   {fa, fa, fa, fa, fa, ErrTerminal, fa, ErrTerminal},
		"mark alerted":  {ErrNotFailed, ErrNotFailed, ErrNotFailed, ErrNotFailed, ErrNotFailed, ErrNotFailed, fa, ErrNotFailed},
	}
	// wantLater overrides want for a record that a later attempt (3)
	// owns: a runner's write for attempt 2 is refused.
	wantLater := map[string][]cell{
		"start attempt": {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"progress":      {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"finish":        {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"retry":         {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"fail":          {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"requeue":       {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"reject":        {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"hold":          {ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrSuperseded, ErrTerminal, ErrTerminal, ErrTerminal},
		"stopped":       {ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrNotCancelled, ErrSuperseded},
	}
	if len(want) != len(transitions) {
		t.Fatalf("table has %d transitions, want %d", len(want), len(transitions))
	}
	for _, later := range []bool{false, true} {
		for _, tr := range transitions {
			row, ok := want[tr.Name]
			if !ok {
				t.Fatalf("no row for transition %q", tr.Name)
			}
			if r, ok := wantLater[tr.Name]; ok && later {
				row = r
			}
			for i, from := range states {
				if later && from == absent {
					continue // an absent record has no attempt
				}
				t.Run(fmt.Sprintf("%s/from %s/later=%v", tr.Name, stateName(from), later), func(t *testing.T) {
					st := &proto.Status{Job: proto.Job{ID: "j"}, State: from}
					if from != absent {
						st.Attempt = 2
						if later {
							st.Attempt = 3
						}
					}
					before := *st
					err := tr.apply(st)
					switch w := row[i].(type) {
					case error:
						if !errors.Is(err, w) {
							t.Fatalf("got %v (state %s), want refusal %v", err, st.State, w)
						}
						if st.State != before.State || st.Attempt != before.Attempt || st.Alerted != before.Alerted {
							t.Errorf("refused transition changed the record: %+v", st)
						}
					case proto.State:
						if err != nil {
							t.Fatalf("refused with %v, want %s", err, w)
						}
						if st.State != w {
							t.Errorf("state %s, want %s", st.State, w)
						}
					}
				})
			}
		}
	}
}

func stateName(s proto.State) string {
	if s == absent {
		return "absent"
	}
	return string(s)
}

// TestSettledRecordsOutcome checks what a runner's settle writes besides
// the state: the agent's figures, and its result only for a success.
func TestSettledRecordsOutcome(t *testing.T) {
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	o := Outcome{Attempt: 1, MaxAttempts: 3, Runner: "r1", FinishedAt: now, Agent: true,
		CostUSD: 0.5, Turns: 4, SessionID: "s", Result: "all good"}
	for _, tc := range []struct {
		tr     Transition
		result string
	}{{Finish(o), "all good"}, {Retry(o), ""}, {Fail(o), ""}} {
		st := &proto.Status{State: proto.StateRunning, Attempt: 1, Result: "stale"}
		if err := tc.tr.apply(st); err != nil {
			t.Fatal(err)
		}
		if st.Result != tc.result || st.CostUSD != 0.5 || st.Turns != 4 || st.SessionID != "s" ||
			st.ExitCode == nil || *st.ExitCode != 0 || !st.FinishedAt.Equal(now) || st.Runner != "r1" {
			t.Errorf("%s wrote %+v", tc.tr.Name, st)
		}
	}

	// The job's cost adds up its attempts', each once, though a settle
	// may be applied again after its answer was lost.
	st := &proto.Status{}
	for i, tr := range []Transition{
		StartAttempt(1, 3, "r1", "", now), Retry(o), Retry(o),
		StartAttempt(2, 3, "r1", "", now), Finish(Outcome{Attempt: 2, MaxAttempts: 3, Agent: true, CostUSD: 0.25}),
		Finish(Outcome{Attempt: 2, MaxAttempts: 3, Agent: true, CostUSD: 0.25}),
	} {
		if err := tr.apply(st); err != nil && i != 5 {
			t.Fatalf("%s: %v", tr.Name, err)
		}
	}
	if st.SpentUSD != 0.75 || st.CostUSD != 0.25 {
		t.Errorf("after attempts costing 0.5 and 0.25: spent %v, cost %v", st.SpentUSD, st.CostUSD)
	}

	st = &proto.Status{State: proto.StateFailed, Attempt: 2, DLQSeq: 5, FinishedAt: now}
	if err := DeadLetter(3, 0, now.Add(time.Hour)).apply(st); err != nil {
		t.Fatal(err)
	}
	if st.Attempt != 3 || st.DLQSeq != 5 || !st.FinishedAt.Equal(now) {
		t.Errorf("dead-letter without a new message lost what was known: %+v", st)
	}
}

// TestHoldKeepsAttempts follows a job held after its first attempt met a
// usage limit, then released: its next delivery is attempt 1 again (the
// held delivery was no attempt), and its message's deliveries count on
// from the attempts used.
func TestHoldKeepsAttempts(t *testing.T) {
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	until := now.Add(time.Hour)
	st := &proto.Status{}
	for _, tr := range []Transition{
		StartAttempt(1, 3, "r1", "", now), Retry(Outcome{Attempt: 1, MaxAttempts: 3}),
		StartAttempt(2, 3, "r1", "", now), Hold(2, "r1", proto.HoldUsageLimit, until, now),
	} {
		if err := tr.apply(st); err != nil {
			t.Fatalf("%s: %v", tr.Name, err)
		}
	}
	if st.State != proto.StateHeld || st.Attempt != 1 || st.HeldReason != proto.HoldUsageLimit ||
		!st.HeldUntil.Equal(until) || st.Holds != 1 {
		t.Fatalf("held record: %+v", st)
	}
	if err := Release("alice").apply(st); err != nil {
		t.Fatal(err)
	}
	if st.State != proto.StateQueued || st.AttemptBase != 1 || st.ReleasedBy != "alice" {
		t.Fatalf("released record: %+v", st)
	}
	if err := Release("").apply(st); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	if err := Hold(2, "r1", proto.HoldOverBudget, time.Time{}, now).apply(st); err != nil || st.Holds != 2 || st.ReleasedBy != "" {
		t.Fatalf("second hold: %v %+v", err, st)
	}
}

// A superseded job is cancelled naming the job that replaced it, and its
// runner's Stopped keeps that reason.
func TestSupersede(t *testing.T) {
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	st := &proto.Status{State: proto.StateRunning, Attempt: 1}
	if err := Supersede("j2", false).apply(st); !errors.Is(err, ErrRunning) || st.State != proto.StateRunning {
		t.Fatalf("a running job superseded where supersede is queued: %v, %s", err, st.State)
	}
	if err := Supersede("j2", true).apply(st); err != nil {
		t.Fatal(err)
	}
	if err := Stopped(1, "r1", -1, now).apply(st); err != nil {
		t.Fatal(err)
	}
	if st.State != proto.StateCancelled || st.Error != proto.ReasonSuperseded || st.SupersededBy != "j2" {
		t.Errorf("superseded record: %+v", st)
	}
}
