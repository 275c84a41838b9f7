// Package spool keeps verified webhook events on local disk while
// JetStream is unreachable, and hands them back in order once it is back.
//
// Gitea and Plane never resend an event the gateway answered, so an event
// the gateway has said yes to must survive a JetStream outage and a
// gateway restart. The layout under the spool directory is one file per
// event:
//
//	00000000000000000001.json   an Entry, as JSON
//	00000000000000000002.json
//	...
//
// named by a sequence number that only grows (it restarts after the
// highest name found at Open). A file is written as <seq>.tmp, fsynced,
// renamed to <seq>.json and the directory fsynced, so a crash leaves either
// the whole entry or none. An entry is deleted once it has been carried
// out.
//
// An entry that can never be carried out (a file that cannot be decoded,
// or one its Handler fails with ErrPermanent) is moved to the quarantine
// directory, kept for a person, and the entries behind it go on:
//
//	quarantine/00000000000000000003.json   the entry as it was
//	quarantine/00000000000000000003.err    why it was moved there
package spool

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/trigger"
)

// RetryDelayDefault is how long Run waits after a failed entry before it
// tries again (it is woken earlier by Kick).
const RetryDelayDefault = time.Second

// WarnEvery is how often Run logs, at warn, that the same entry still
// fails: at its first failure, then once a minute with the count.
const WarnEvery = time.Minute

// QuarantineDirName is the quarantine's directory inside the spool's.
const QuarantineDirName = "quarantine"

// ErrPermanent marks a Handler's error that retrying cannot fix: Run
// moves the entry to the quarantine instead of trying it again.
var ErrPermanent = errors.New("spool entry cannot be carried out")

// Entry is one spooled event: what the gateway decided to do with it.
type Entry struct {
	// Seq orders entries; it is the file name, not stored in it.
	Seq uint64 `json:"-"`
	// Source and Event say where the event came from, for logs.
	Source string `json:"source"`
	Event  string `json:"event,omitempty"`
	// Cancel and Jobs are the trigger decision, carried out in this
	// order.
	Cancel *trigger.Cancel `json:"cancel,omitempty"`
	Jobs   []proto.Job     `json:"jobs,omitempty"`
	// SpooledAt is when the entry was written.
	SpooledAt time.Time `json:"spooled_at"`
}

// Spool is a directory of entries. Its methods are safe for concurrent use.
type Spool struct {
	dir  string
	kick chan struct{}

	mu          sync.Mutex
	next        uint64
	waiting     []waiting // oldest first; len is the depth
	quarantined uint64
}

// waiting is one entry in the spool and when it was written.
type waiting struct {
	seq uint64
	at  time.Time
}

// Open opens (creating it if needed) the spool in dir.
func Open(dir string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating spool: %w", err)
	}
	s := &Spool{dir: dir, kick: make(chan struct{}, 1), next: 1}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading spool: %w", err)
	}
	for _, e := range names {
		name := e.Name()
		base, ext, _ := strings.Cut(name, ".")
		seq, err := strconv.ParseUint(base, 10, 64)
		if err != nil {
			continue
		}
		s.next = max(s.next, seq+1)
		switch ext {
		case "json":
			at := time.Now()
			if info, err := e.Info(); err == nil {
				at = info.ModTime()
			}
			s.waiting = append(s.waiting, waiting{seq: seq, at: at})
		case "tmp": // a write that never finished: never answered either
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
	slices.SortFunc(s.waiting, func(a, b waiting) int { return cmp.Compare(a.seq, b.seq) })
	return s, nil
}

// Dir is the spool's directory.
func (s *Spool) Dir() string { return s.dir }

// Depth is the number of entries waiting.
func (s *Spool) Depth() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// OldestAge is how long the oldest entry has waited, zero when none
// does. An entry found at Open has waited since its file was written.
func (s *Spool) OldestAge() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) == 0 {
		return 0
	}
	return max(time.Since(s.waiting[0].at), 0)
}

// Quarantined is the number of entries moved to the quarantine since Open.
func (s *Spool) Quarantined() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quarantined
}

// QuarantineDir is where entries that can never be carried out are kept.
func (s *Spool) QuarantineDir() string { return filepath.Join(s.dir, QuarantineDirName) }

// Append writes e durably and returns its sequence. Only once it returns
// nil may the event be answered.
func (s *Spool) Append(e *Entry) (uint64, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("encoding spool entry: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := s.next
	tmp := filepath.Join(s.dir, fileName(seq, "tmp"))
	if err := writeSync(tmp, data); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("writing spool entry: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, fileName(seq, "json"))); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("writing spool entry: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return 0, fmt.Errorf("writing spool entry: %w", err)
	}
	s.next++
	s.waiting = append(s.waiting, waiting{seq: seq, at: cmp.Or(e.SpooledAt, time.Now())})
	e.Seq = seq
	s.Kick()
	return seq, nil
}

// Kick wakes Run, for example when JetStream is back.
func (s *Spool) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Oldest returns the entries waiting, oldest first.
func (s *Spool) Oldest() ([]uint64, error) {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("reading spool: %w", err)
	}
	var seqs []uint64
	for _, e := range names {
		base, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if seq, err := strconv.ParseUint(base, 10, 64); err == nil {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// ErrCorrupt is returned by Read for an entry that cannot be decoded.
var ErrCorrupt = errors.New("corrupt spool entry")

// Read returns entry seq.
func (s *Spool) Read(seq uint64) (*Entry, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, fileName(seq, "json")))
	if err != nil {
		return nil, fmt.Errorf("reading spool entry %d: %w", seq, err)
	}
	var e Entry
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("%w %d: %v", ErrCorrupt, seq, err)
	}
	e.Seq = seq
	return &e, nil
}

// Remove deletes entry seq once it has been carried out.
func (s *Spool) Remove(seq uint64) error {
	return s.drop(seq, func(path string) error { return os.Remove(path) })
}

// quarantine moves entry seq, which can never be carried out, to the
// quarantine directory, with why beside it.
func (s *Spool) quarantine(seq uint64, why error) error {
	qdir := s.QuarantineDir()
	if err := os.MkdirAll(qdir, 0o700); err != nil {
		return fmt.Errorf("quarantining spool entry %d: %w", seq, err)
	}
	if err := os.WriteFile(filepath.Join(qdir, fileName(seq, "err")), []byte(why.Error()+"\n"), 0o600); err != nil {
		return fmt.Errorf("quarantining spool entry %d: %w", seq, err)
	}
	err := s.drop(seq, func(path string) error {
		if err := os.Rename(path, filepath.Join(qdir, fileName(seq, "json"))); err != nil {
			return err
		}
		return syncDir(qdir)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.quarantined++
	s.mu.Unlock()
	return nil
}

func (s *Spool) drop(seq uint64, op func(string) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := op(filepath.Join(s.dir, fileName(seq, "json"))); err != nil {
		return fmt.Errorf("removing spool entry %d: %w", seq, err)
	}
	if i, ok := slices.BinarySearchFunc(s.waiting, seq, func(w waiting, seq uint64) int { return cmp.Compare(w.seq, seq) }); ok {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("removing spool entry %d: %w", seq, err)
	}
	return nil
}

// Handler carries out one entry. An error leaves the entry in the spool,
// to be tried again, unless it is ErrPermanent, which sends the entry to
// the quarantine; it must be safe to carry out an entry twice.
type Handler func(context.Context, *Entry) error

// Run drains the spool in order until ctx ends: each entry is handed to
// handle and removed once handle returns nil. After a failure it waits
// retry (or a Kick) and starts again from the same entry, so entries are
// never reordered; an entry that fails for good is quarantined and the
// next one taken at once. Run is the spool's only reader; start it once.
func (s *Spool) Run(ctx context.Context, handle Handler, retry time.Duration, log *zap.Logger) {
	retry = max(retry, 10*time.Millisecond)
	var f failing
	for {
		var timer <-chan time.Time // nil: wait for a Kick only
		if s.drainOnce(ctx, handle, &f, log) {
			timer = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-timer:
		}
	}
}

// failing is the entry that failed last, so that its failures are logged
// at warn without a line a second.
type failing struct {
	seq      uint64
	attempts int
	warned   time.Time
}

// failed notes one more failure of e and logs it at warn when it is the
// first or WarnEvery has passed since the last line.
func (f *failing) failed(e *Entry, err error, log *zap.Logger) {
	if f.seq != e.Seq {
		*f = failing{seq: e.Seq}
	}
	f.attempts++
	if time.Since(f.warned) < WarnEvery {
		return
	}
	f.warned = time.Now()
	log.Warn("spool entry not carried out yet, will retry", zap.Uint64("seq", e.Seq), zap.Strings("jobs", jobIDs(e)),
		zap.Int("attempts", f.attempts), zap.Duration("waiting", time.Since(e.SpooledAt)), zap.Error(err))
}

func jobIDs(e *Entry) []string {
	ids := make([]string, 0, len(e.Jobs))
	for _, j := range e.Jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// drainOnce carries out entries until the spool is empty (false) or one
// fails (true: wait before the next attempt).
func (s *Spool) drainOnce(ctx context.Context, handle Handler, f *failing, log *zap.Logger) bool {
	seqs, err := s.Oldest()
	if err != nil {
		log.Error("listing spool", zap.Error(err))
		return true
	}
	for _, seq := range seqs {
		if ctx.Err() != nil {
			return false
		}
		e, err := s.Read(seq)
		if errors.Is(err, ErrCorrupt) {
			log.Warn("spool entry cannot be decoded, quarantined", zap.Uint64("seq", seq),
				zap.String("quarantine", s.QuarantineDir()), zap.Error(err))
			if err := s.quarantine(seq, err); err != nil {
				log.Error("quarantining spool entry", zap.Uint64("seq", seq), zap.Error(err))
				return true
			}
			continue
		}
		if err != nil {
			log.Error("reading spool", zap.Uint64("seq", seq), zap.Error(err))
			return true
		}
		if err := handle(ctx, e); err != nil {
			if errors.Is(err, ErrPermanent) {
				log.Warn("spool entry can never be carried out, quarantined", zap.Uint64("seq", seq),
					zap.Strings("jobs", jobIDs(e)), zap.String("quarantine", s.QuarantineDir()), zap.Error(err))
				if err := s.quarantine(seq, err); err != nil {
					log.Error("quarantining spool entry", zap.Uint64("seq", seq), zap.Error(err))
					return true
				}
				continue
			}
			if ctx.Err() == nil {
				f.failed(e, err, log)
			}
			return true
		}
		if err := s.Remove(seq); err != nil {
			log.Error("removing drained spool entry", zap.Uint64("seq", seq), zap.Error(err))
			return true
		}
		log.Info("spool entry carried out", zap.Uint64("seq", seq), zap.Int("depth", s.Depth()))
	}
	return false
}

func fileName(seq uint64, ext string) string { return fmt.Sprintf("%020d.%s", seq, ext) }

func writeSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
