package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/proto"
)

// orphanGrace is how long an agent may outlive its SIGKILLed runner: the
// supervisor sees the runner gone and kills the agent's group, or the
// parent-death signals reach it one process at a time (the supervisor's
// wrapper, the supervisor, bwrap, bwrap's pid 1). On a 2-core VM where a
// process costs milliseconds to make and to end, that took 112 to 319 ms
// (docs/performance.md, seventeenth session): 100 ms failed make test
// there. The soak sees only an agent's end line, and its agent's work is
// 10 to 99 ms, so this check catches a kill that comes late, not an agent
// that outlives its runner for good; the agent package's tests do that
// (TestPoolEndsWithItsOwner, TestPoolSupervisorKilledWhileWaiting).
const orphanGrace = 500 * time.Millisecond

// run is one agent run of a job, from its record.
type run struct {
	attempt int
	tag     string // the runner incarnation
	start   time.Time
	ended   bool // the agent wrote its end line
	code    int
	end     time.Time
	// stopped is when the agent's runner stopped it, if the agent could
	// say so before it died.
	stopped time.Time
}

// readRuns parses the record of one job.
func readRuns(path string) ([]run, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []run
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) == 4 && fs[0] == "start":
			a, _ := strconv.Atoi(fs[1])
			runs = append(runs, run{attempt: a, tag: fs[2], start: unixNano(fs[3])})
		case len(fs) == 5 && fs[0] == "end":
			a, _ := strconv.Atoi(fs[1])
			for i := range runs {
				if runs[i].attempt == a && runs[i].tag == fs[2] && !runs[i].ended {
					runs[i].ended = true
					runs[i].code, _ = strconv.Atoi(fs[3])
					runs[i].end = unixNano(fs[4])
					break
				}
			}
		case len(fs) == 4 && fs[0] == "stopped":
			a, _ := strconv.Atoi(fs[1])
			for i := range runs {
				if runs[i].attempt == a && runs[i].tag == fs[2] && !runs[i].ended && runs[i].stopped.IsZero() {
					runs[i].stopped = unixNano(fs[3])
					break
				}
			}
		}
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].start.Before(runs[j].start) })
	return runs, sc.Err()
}

func unixNano(s string) time.Time {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(0, n)
}

// planned is the exit code the agent script gives attempt a of j.
func planned(j job, attempt int) int {
	if j.doomed || (attempt == 1 && j.id[0] >= '0' && j.id[0] <= '4') {
		return 1
	}
	return 0
}

// report is what the soak found.
type report struct {
	jobs, done, failed, doomedFailed, other int
	alerts, alertMsgs                       int
	runs, plannedFailures, killedRuns       int
	redeliveredAfterSuccess                 int
	kills, jsRestarts                       int
	maxConcurrent                           int
	lost                                    int
	queue                                   map[string]int
	elapsed                                 time.Duration
	// calmRate and chaosRate are jobs ended per second without and with
	// the chaos; queueLag is how long GET /queue took to agree with the
	// status bucket once the system was quiet (-1: it never did).
	calmRate, chaosRate float64
	queueLag            time.Duration
	queueLagLimit       time.Duration
	// perProject is the most agents of each project at once.
	perProject map[string]int
	// superseded are the jobs a newer one of their task and kind
	// cancelled while they waited.
	superseded int
	// refused is the webhooks answered otherwise than 202 before their
	// 202 (or not answered), spooled those whose 202 said spooled, and
	// spoolPeak the gateway's deepest spool seen.
	refused, spooled, spoolPeak int
	// waitMax is the longest a job waited from its 202 to its first agent
	// run; waitMaxOutage the longest of the waits that overlapped an
	// outage (a JetStream restart, a cluster member down or cut off).
	waitMax, waitMaxOutage time.Duration
	// stall is the longest time no agent started while some job waited
	// for its first run, and stallOutage the longest such time that
	// overlapped an outage: what an outage costs beside the backlog.
	stall, stallOutage time.Duration
	problems           []string
}

func (r *report) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// check reads the status bucket, the fake Telegram and the run records,
// and holds them against what retries, kills and restarts explain.
func (s *system) check(jobs []job, queue map[string]int, queueLag time.Duration) *report {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &report{jobs: len(jobs), kills: s.kills, jsRestarts: len(s.jsDown), queue: queue, queueLag: queueLag, queueLagLimit: s.queueLagLimit()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alerts, msgs := alerts(s.tg)
	r.alertMsgs = msgs
	known := map[string]bool{}
	supersededBy := map[string]string{}
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	// byProject are each project's events, held to its max_concurrency.
	byProject := map[string][]event{}

	outages := s.outages()
	var starts []time.Time // of every agent run
	var waits []window     // each job's, from its 202 to its first run
	for _, j := range jobs {
		known[j.id] = true
		if j.refused > 0 {
			r.refused++
			if s.cluster != nil {
				r.problem("webhook of job %s was answered %d times otherwise than 202 before its 202 (last: %s)", j.id, j.refused, j.refusal)
			}
		}
		if j.spooled {
			r.spooled++
		}
		st, err := s.status(ctx, j.id)
		switch {
		case err != nil:
			r.lost++
			r.problem("job %s lost: no status record (%v)", j.id, err)
			continue
		case st.State == proto.StateDone:
			r.done++
		case st.State == proto.StateFailed:
			r.failed++
			if j.doomed {
				r.doomedFailed++
			}
		case st.State == proto.StateCancelled && st.Error == proto.ReasonSuperseded && st.SupersededBy != "":
			// A newer job of its task and kind replaced it while it waited
			// (the registry's supersede): not lost, if the soak queued
			// that one (checked below).
			r.superseded++
			supersededBy[j.id] = st.SupersededBy
		default:
			r.other++
			r.lost++
			r.problem("job %s lost: ended the soak %s after %d agent runs (attempt %d, runner %q, error %q)",
				j.id, st.State, countRuns(s.records, j.id), st.Attempt, st.Runner, st.Error)
		}
		n := alerts[j.id]
		r.alerts += n
		switch {
		case st.State == proto.StateFailed && n != 1:
			r.problem("job %s failed and was alerted %d times, want exactly 1", j.id, n)
		case st.State != proto.StateFailed && n != 0:
			r.problem("job %s is %s but was alerted %d times", j.id, st.State, n)
		}

		runs, err := readRuns(filepath.Join(s.records, j.id))
		if err != nil {
			r.problem("reading runs of %s: %v", j.id, err)
			continue
		}
		r.runs += len(runs)
		for _, ru := range runs {
			starts = append(starts, ru.start)
		}
		if len(runs) > 0 && !j.accepted.IsZero() {
			w := window{j.accepted, runs[0].start}
			waits = append(waits, w)
			r.waitMax = max(r.waitMax, w.to.Sub(w.from))
			if slices.ContainsFunc(outages, w.overlaps) {
				r.waitMaxOutage = max(r.waitMaxOutage, w.to.Sub(w.from))
			}
		}
		if len(runs) > maxAttempts {
			r.problem("job %s: %d agent runs, more than ORCH_MAX_ATTEMPTS=%d", j.id, len(runs), maxAttempts)
		}
		interrupted := false
		for i, ru := range runs {
			end := ru.end
			switch {
			case !ru.ended && !ru.stopped.IsZero():
				// Stopped by its runner, which lived on: its slot was
				// held until then.
				end = ru.stopped
				r.killedRuns++
				interrupted = true
			case !ru.ended:
				// No end line: the agent died with its runner. Its slot
				// was held until the kill (or the final stop).
				end = s.ended[ru.tag]
				if !s.killed[ru.tag] && end.IsZero() {
					r.problem("job %s: run %d on %s never ended", j.id, ru.attempt, ru.tag)
				}
				r.killedRuns++
				interrupted = true
			case s.killed[ru.tag] && ru.end.After(s.ended[ru.tag].Add(orphanGrace)):
				r.problem("job %s: agent of run %d outlived its runner %s by %v (orphan)", j.id, ru.attempt, ru.tag, ru.end.Sub(s.ended[ru.tag]))
			}
			if ru.ended && ru.code != planned(j, ru.attempt) {
				r.problem("job %s: run %d exited %d, the script plans %d", j.id, ru.attempt, ru.code, planned(j, ru.attempt))
			}
			if ru.ended && ru.code != 0 {
				r.plannedFailures++
			}
			if !end.IsZero() {
				events = append(events, event{ru.start, +1}, event{end, -1})
				byProject[j.project] = append(byProject[j.project], event{ru.start, +1}, event{end, -1})
			}
			if slices.ContainsFunc(runs[:i], func(p run) bool { return p.attempt == ru.attempt }) {
				r.problem("job %s: attempt %d ran twice", j.id, ru.attempt)
			}
			if i == 0 {
				continue
			}
			// A run after the first needs a cause in the one before it.
			prev := runs[i-1]
			switch {
			case !prev.ended, prev.code != 0:
				// a kill or a planned failure
			case s.explainedRedelivery(prev, ru):
				r.redeliveredAfterSuccess++
				interrupted = true
			default:
				r.problem("job %s: run %d (on %s) follows a successful run %d (on %s) with no kill or restart in between",
					j.id, ru.attempt, ru.tag, prev.attempt, prev.tag)
			}
		}
		switch {
		case st.State == proto.StateDone && (len(runs) == 0 || !runs[len(runs)-1].ended || runs[len(runs)-1].code != 0):
			r.problem("job %s is done without a successful last agent run", j.id)
		case st.State == proto.StateFailed && !j.doomed && !interrupted &&
			s.killsBetween(st.Job.CreatedAt, st.UpdatedAt) < st.Attempt-len(runs):
			// A delivery that ran no agent was lost with a runner killed
			// before the agent started (waiting for the task's lock, say):
			// each needs a kill during the job's life.
			r.problem("job %s failed after %d agent runs, yet it was meant to succeed, no run of it was interrupted, and too few runners were killed during its life to explain %d deliveries (error %q)",
				j.id, len(runs), st.Attempt, st.Error)
		case st.State == proto.StateDone && j.doomed:
			r.problem("job %s is done, yet every run of it fails", j.id)
		}
	}
	for id, by := range supersededBy {
		if !known[by] {
			r.lost++
			r.problem("job %s was superseded by %s, which the soak never queued", id, by)
		}
	}
	for id, n := range alerts {
		if !known[id] {
			r.problem("alert (%d) for job %s that the soak never queued", n, id)
		}
	}

	// The most agents ever running at once, across both runners, in all
	// and per project.
	most := func(events []event) int {
		sort.Slice(events, func(i, j int) bool {
			if events[i].at.Equal(events[j].at) {
				return events[i].delta < events[j].delta
			}
			return events[i].at.Before(events[j].at)
		})
		cur, top := 0, 0
		for _, e := range events {
			cur += e.delta
			top = max(top, cur)
		}
		return top
	}
	r.maxConcurrent = most(events)
	if r.maxConcurrent > maxConcurrency {
		r.problem("%d agents ran at once, more than ORCH_MAX_CONCURRENCY=%d", r.maxConcurrent, maxConcurrency)
	}
	r.perProject = map[string]int{}
	for _, p := range soakProjects {
		r.perProject[p.key] = most(byProject[p.key])
		if p.limit > 0 && r.perProject[p.key] > p.limit {
			r.problem("%d agents of project %s ran at once, more than its max_concurrency %d", r.perProject[p.key], p.key, p.limit)
		}
	}
	switch limit := s.queueLagLimit(); {
	case r.queueLag < 0:
		r.problem("GET /queue never agreed with the status bucket once quiet (waited %v)", limit)
	case r.queueLag > limit:
		r.problem("GET /queue took %v to agree with the status bucket once quiet, more than %v", r.queueLag, limit)
	}
	if r.queue != nil && (r.queue["done"] != r.done || r.queue["failed"] != r.failed) {
		r.problem("GET /queue counts done=%d failed=%d, the status bucket holds done=%d failed=%d (the gateway's index is stale)",
			r.queue["done"], r.queue["failed"], r.done, r.failed)
	}
	r.stall, r.stallOutage = stalls(starts, waits, outages)
	r.spoolPeak = s.spoolPeak
	switch {
	case s.cluster != nil:
		s.cluster.check(r, s.dir)
	case r.kills == 0 || r.jsRestarts != 1:
		r.problem("chaos incomplete: %d runner kills, %d JetStream restarts", r.kills, r.jsRestarts)
	}
	return r
}

// outages are the windows in which JetStream, or a part of it, was away:
// the JetStream restart, and a cluster member down or cut off until it
// was current again.
func (s *system) outages() []window {
	out := slices.Clone(s.jsDown)
	if s.cluster != nil {
		out = append(out, s.cluster.windows()...)
	}
	return out
}

func (w window) overlaps(o window) bool { return w.from.Before(o.to) && o.from.Before(w.to) }

// stalls finds the longest time between two agent starts while a job
// waited for its first run (from its 202, or the earlier start, to the
// later start), overall and among those that overlapped an outage.
func stalls(starts []time.Time, waits []window, outages []window) (longest, acrossOutage time.Duration) {
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(starts); i++ {
		gap := window{starts[i-1], starts[i]}
		if gap.to.Sub(gap.from) <= longest && gap.to.Sub(gap.from) <= acrossOutage {
			continue // cannot beat either
		}
		// The earliest 202 of a job still waiting at the gap's end.
		from := gap.to
		for _, w := range waits {
			if w.from.Before(from) && !w.to.Before(gap.to) {
				from = w.from
			}
		}
		if from.Equal(gap.to) {
			continue // nobody waited
		}
		stall := window{latest(from, gap.from), gap.to}
		d := stall.to.Sub(stall.from)
		longest = max(longest, d)
		if slices.ContainsFunc(outages, stall.overlaps) {
			acrossOutage = max(acrossOutage, d)
		}
	}
	return longest, acrossOutage
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// explainedRedelivery reports whether a kill of prev's runner or a
// JetStream restart came between a successful run and the next one: the
// ack may then have been lost, and JetStream rightly redelivers.
func (s *system) explainedRedelivery(prev, next run) bool {
	// An agent may write its end line in the moments after its runner was
	// killed, before the supervisor kills it (the orphan check allows it
	// orphanGrace): its success was never settled either.
	if t, ok := s.ended[prev.tag]; ok && s.killed[prev.tag] && t.After(prev.end.Add(-orphanGrace)) && t.Before(next.start) {
		return true
	}
	for _, w := range s.outages() {
		if w.to.After(prev.end) && w.from.Before(next.start) {
			return true
		}
	}
	return false
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nsoak summary (%v)\n", r.elapsed.Round(time.Second))
	fmt.Fprintf(w, "  jobs accepted          %d\n", r.jobs)
	fmt.Fprintf(w, "  done / failed / other  %d / %d / %d   (failed: %d doomed, %d after kills ate their attempts; superseded %d)\n",
		r.done, r.failed, r.other, r.doomedFailed, r.failed-r.doomedFailed, r.superseded)
	fmt.Fprintf(w, "  GET /queue counts      %v (agreed with the bucket after %v, target <= %v)\n", r.queue, r.queueLag.Round(time.Millisecond), r.queueLagLimit)
	fmt.Fprintf(w, "  drain rate             %.1f jobs/s without chaos, %.1f jobs/s under it: %.2fx (target >= 0.5x)\n",
		r.calmRate, r.chaosRate, r.chaosRate/r.calmRate)
	fmt.Fprintf(w, "  telegram alerts        %d messages, %d naming soak jobs (want = failed)\n", r.alertMsgs, r.alerts)
	fmt.Fprintf(w, "  agent runs             %d: %d planned failures, %d killed with their runner, %d redelivered after a lost ack, none unexplained unless listed below\n",
		r.runs, r.plannedFailures, r.killedRuns, r.redeliveredAfterSuccess)
	fmt.Fprintf(w, "  chaos                  %d runner SIGKILLs, %d JetStream restart(s)\n", r.kills, r.jsRestarts)
	fmt.Fprintf(w, "  webhooks               %d answered otherwise than 202 first, %d spooled; spool peak %d\n", r.refused, r.spooled, r.spoolPeak)
	fmt.Fprintf(w, "  wait for a slot        longest %v, longest across an outage %v; no agent started for %v while jobs waited (%v across an outage)\n",
		r.waitMax.Round(time.Millisecond), r.waitMaxOutage.Round(time.Millisecond), r.stall.Round(time.Millisecond), r.stallOutage.Round(time.Millisecond))
	fmt.Fprintf(w, "  max agents at once     %d (limit %d)\n", r.maxConcurrent, maxConcurrency)
	for _, p := range soakProjects {
		limit := "ORCH_MAX_CONCURRENCY"
		if p.limit > 0 {
			limit = strconv.Itoa(p.limit)
		}
		fmt.Fprintf(w, "    of %-19s %d (limit %s)\n", p.key, r.perProject[p.key], limit)
	}
	fmt.Fprintf(w, "  lost                   %d\n", r.lost)
	if len(r.problems) == 0 {
		fmt.Fprintln(w, "  result                 PASS")
		return
	}
	fmt.Fprintf(w, "  result                 FAIL: %d problems\n", len(r.problems))
	for i, p := range r.problems {
		if i == 20 {
			fmt.Fprintf(w, "    ... and %d more\n", len(r.problems)-20)
			break
		}
		fmt.Fprintf(w, "    - %s\n", p)
	}
}

func countRuns(dir, id string) int {
	runs, _ := readRuns(filepath.Join(dir, id))
	return len(runs)
}

// killsBetween counts the runner SIGKILLs from from to to, and the
// cluster's outages that overlap that time: each may cost every job in
// flight a delivery (a lease lost while a leader moves).
func (s *system) killsBetween(from, to time.Time) int {
	n := 0
	for tag, at := range s.ended {
		if s.killed[tag] && !at.Before(from) && !at.After(to) {
			n++
		}
	}
	if s.cluster != nil {
		life := window{from, to}
		for _, w := range s.cluster.windows() {
			if w.overlaps(life) {
				n++
			}
		}
	}
	return n
}
