package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// EtcRefresh is how often the runner calls Etc.Refresh: a change to the
// host's /etc reaches the sandboxes started this long after it at most.
const EtcRefresh = 10 * time.Second

// Etc keeps a copy of the parts of the host's /etc a sandbox shows
// (etcFiles) for each sandbox to bind as its /etc in one mount (Job.Etc):
// binding the two dozen of them one by one took about a quarter of a
// sandbox's start (docs/performance.md). The copy holds only what every
// user of the host may read: a file or directory closed to others (the
// private keys under /etc/ssl/private) is left out, where a bind of
// /etc/ssl showed it to an agent of a runner that runs as its owner.
//
// The copy follows the host: Refresh, which the runner calls every
// EtcRefresh off any job's path, makes a new one when anything it copies
// changed (a name, a mode, a size, a modification time, a link's
// target). A sandbox keeps the copy it started with (Acquire) to its
// end, and a copy neither current nor in use is removed.
type Etc struct {
	src, dir string
	// refreshing makes Refresh one at a time.
	refreshing sync.Mutex
	next       int

	mu  sync.Mutex
	cur *etcCopy
}

// etcCopy is one copy of the host's files: its directory, the
// fingerprint of what it copied, and the sandboxes that use it.
type etcCopy struct {
	path, print string
	users       int
}

// NewEtc makes the first copy of src's etcFiles (src is /etc, but in
// tests) in a directory under dir, which it empties first: the copies a
// runner stopped before removing them are of no use.
func NewEtc(src, dir string) (*Etc, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("removing the old copies of /etc: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("a copy of /etc for the sandboxes: %w", err)
	}
	e := &Etc{src: src, dir: dir}
	if _, err := e.Refresh(); err != nil {
		return nil, err
	}
	return e, nil
}

// Acquire returns the directory of the current copy, for a sandbox to
// bind as its /etc, and the release to call once the sandbox has ended
// (calling it again does nothing).
func (e *Etc) Acquire() (string, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.cur
	c.users++
	var once sync.Once
	return c.path, func() {
		once.Do(func() {
			e.mu.Lock()
			c.users--
			drop := c.users == 0 && c != e.cur
			e.mu.Unlock()
			if drop {
				_ = os.RemoveAll(c.path)
			}
		})
	}
}

// Refresh makes a new copy when the host's files changed since the
// current one was made, and says whether it did. Sandboxes started from
// then on get the new copy.
func (e *Etc) Refresh() (bool, error) {
	e.refreshing.Lock()
	defer e.refreshing.Unlock()
	print, err := e.fingerprint()
	if err != nil {
		return false, err
	}
	e.mu.Lock()
	same := e.cur != nil && e.cur.print == print
	e.mu.Unlock()
	if same {
		return false, nil
	}
	path := filepath.Join(e.dir, strconv.Itoa(e.next))
	e.next++
	// Made aside and renamed into place: no sandbox binds half a copy.
	tmp := path + ".tmp"
	if err := e.copyTo(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return false, fmt.Errorf("copying /etc for the sandboxes: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.RemoveAll(tmp)
		return false, fmt.Errorf("copying /etc for the sandboxes: %w", err)
	}
	e.mu.Lock()
	old := e.cur
	e.cur = &etcCopy{path: path, print: print}
	drop := old != nil && old.users == 0
	e.mu.Unlock()
	if drop {
		_ = os.RemoveAll(old.path)
	}
	return true, nil
}

// Close removes the copies. The runner closes it once its last sandbox
// has ended.
func (e *Etc) Close() error { return os.RemoveAll(e.dir) }

// fingerprint sums up what a copy made now would hold.
func (e *Etc) fingerprint() (string, error) {
	h := sha256.New()
	err := e.walk(func(rel, _ string, fi fs.FileInfo, link string) error {
		_, err := fmt.Fprintf(h, "%s\x00%o\x00%d\x00%d\x00%s\n", rel, fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), link)
		return err
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// copyTo makes a copy of the host's files in dir.
func (e *Etc) copyTo(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return e.walk(func(rel, path string, fi fs.FileInfo, link string) error {
		dst := filepath.Join(dir, rel)
		switch {
		case link != "":
			return os.Symlink(link, dst)
		case fi.IsDir():
			return os.Mkdir(dst, 0o755)
		default:
			return copyFile(path, dst, fi.Mode().Perm())
		}
	})
}

// walk calls fn, parents first, for each file, directory and link of the
// copy: by its path relative to the copy, its path on the host, its
// information and, for a link, its target. Each of etcFiles that exists
// is followed when it is a link (as a bind would be); within a
// directory, links are kept. What others may not read, and anything
// but a file, a directory or a link, is left out.
func (e *Etc) walk(fn func(rel, path string, fi fs.FileInfo, link string) error) error {
	for _, name := range etcFiles {
		top, err := filepath.EvalSymlinks(filepath.Join(e.src, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(top, path)
			if err != nil {
				return err
			}
			rel = filepath.Join(name, rel)
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				link, err := os.Readlink(path)
				if err != nil {
					return err
				}
				return fn(rel, path, fi, link)
			case fi.IsDir() && fi.Mode().Perm()&0o005 == 0o005:
				return fn(rel, path, fi, "")
			case fi.IsDir():
				return filepath.SkipDir
			case fi.Mode().IsRegular() && fi.Mode().Perm()&0o004 != 0:
				return fn(rel, path, fi, "")
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies the file src to dst, a new file with mode perm.
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
