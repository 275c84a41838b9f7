package taskstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// memo is what a Store saved last for each task: the bundle of its
// commits, kept by the tip it was made for, and the digest of the state's
// content. A periodic save of a task whose agent did not change it since
// then bundles nothing again (git compresses every object of a bundle
// anew: seconds for tens of MiB) and puts nothing.
type memo struct {
	mu    sync.Mutex
	byKey map[string]*last
}

type last struct {
	// tip is HEAD and the remote refs the bundle was made against.
	tip string
	// bundle is the kept bundle's path, "" when none is kept.
	bundle string
	// digest is the sha256 of the last state put, without its time.
	digest string
	// saved is the manifest of the last state put, and nuid the object
	// it was put as: while the store still holds that object, it is the
	// task's state (see Restore).
	saved *Manifest
	nuid  string
}

func (m *memo) get(key string) last {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.byKey[key]; l != nil {
		return *l
	}
	return last{}
}

func (m *memo) set(key string, l last) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byKey == nil {
		m.byKey = map[string]*last{}
	}
	m.byKey[key] = &l
}

func (m *memo) drop(key string) {
	m.mu.Lock()
	l := m.byKey[key]
	delete(m.byKey, key)
	m.mu.Unlock()
	if l != nil && l.bundle != "" {
		_ = os.Remove(l.bundle)
	}
}

// bundleDir holds the kept bundles.
func (s *Store) bundleDir() (string, error) {
	dir := filepath.Join(cmpOr(s.TempDir, os.TempDir()), "taskstate-bundles")
	return dir, os.MkdirAll(dir, 0o700)
}

// tipOf is what a bundle of the worktree's unpushed commits depends on:
// HEAD and the refs it excludes.
func tipOf(ctx context.Context, wt, head string) (string, error) {
	refs, err := git(ctx, wt, append([]string{"for-each-ref", "--format=%(objectname) %(refname)"}, onOrigin...)...)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(head + "\n" + refs))
	return hex.EncodeToString(sum[:]), nil
}

// bundle returns the bundle of the worktree's unpushed commits for tip:
// the kept one when it was made for tip, else a new one, kept.
func (s *Store) bundle(ctx context.Context, key, wt, tip string) (string, error) {
	if l := s.memo.get(key); l.tip == tip && l.bundle != "" {
		if _, err := os.Stat(l.bundle); err == nil {
			return l.bundle, nil
		}
	}
	dir, err := s.bundleDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, key+".bundle")
	if _, err := git(ctx, wt, append([]string{"bundle", "create", "--quiet", path + ".new", "HEAD"}, notOnOrigin()...)...); err != nil {
		_ = os.Remove(path + ".new")
		return "", fmt.Errorf("bundling unpushed commits: %w", err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		return "", err
	}
	l := s.memo.get(key)
	l.tip, l.bundle = tip, path
	s.memo.set(key, l)
	return path, nil
}

// digestOf is the sha256 of a state's content: the manifest's fields but
// its time, and every part.
func digestOf(m Manifest, files map[string]string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%d\n%v\n%d\n%s\n%s\n%v\n", m.Runner, m.Head, m.Branch, m.Commits, m.Changes, m.Untracked, m.Omitted, m.SessionID, m.Session)
	for _, name := range []string{entryCommits, entryChanges, entryUntracked, entrySession} {
		p, ok := files[name]
		if !ok {
			continue
		}
		fmt.Fprintf(h, "%s\n", name)
		f, err := os.Open(p)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Clean removes what a runner killed while saving or restoring left in
// TempDir (temporary directories, kept bundles: the memo starts empty).
func (s *Store) Clean() error {
	root := cmpOr(s.TempDir, os.TempDir())
	var errs []error
	for _, pattern := range []string{"taskstate-save-*", "taskstate-restore-*", "taskstate-bundles"} {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
