package workspace

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Knowing a worktree clean without git.
//
// `git status` is what a job in a worktree that is already at its head
// would still run: the earlier job's uncommitted work is to be named in
// the task file. Most of the time there is none, and the answer can be had
// from the files git itself keeps: when git last found the worktree
// clean, the job wrote down HEAD and the identity of the index file
// (inode, size, modification time) in cleanMark. A later job finds it
// clean without git when
//
//   - HEAD and the index file are still those: nothing was staged,
//     committed or checked out since (git replaces the index file on every
//     change, so its inode changes);
//   - every file the index lists still has the stat data the index
//     recorded for it (times, inode, size, mode, owner), which is how git
//     itself decides a file is unchanged; one written in the same clock
//     tick as the index ("racily clean", as in a worktree just checked
//     out) must also hash to the blob the index names;
//   - no file is there that the index does not list (the task files under
//     .orch/ excepted).
//
// Anything else, or anything the reader does not know (index versions
// other than 2 and 3, split or sparse indexes, conflicts, submodules,
// more than maxCleanEntries files), runs git status as before.

// cleanMark is the file, in a worktree's private git directory, that
// records the state in which git last found the worktree clean.
const cleanMark = "orch-clean"

// maxCleanEntries bounds the worktrees checked in-process: past it, git's
// own status (with its caches) is the better tool.
const maxCleanEntries = 10_000

// markClean records that the worktree, at head, is clean as its index is
// now.
func (wt worktree) markClean(head string) {
	if wt.own == "" || head == "" {
		return
	}
	id, err := fileID(filepath.Join(wt.own, "index"))
	if err != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(wt.own, cleanMark), []byte("HEAD "+head+"\nindex "+id+"\n"), 0o644)
}

// knownClean reports whether the worktree, at head, is certainly clean
// (see above); false means git is to be asked.
func (wt worktree) knownClean(head string) bool {
	if wt.own == "" || head == "" {
		return false
	}
	mark, err := os.ReadFile(filepath.Join(wt.own, cleanMark))
	if err != nil {
		return false
	}
	indexPath := filepath.Join(wt.own, "index")
	id, err := fileID(indexPath)
	if err != nil || string(mark) != "HEAD "+head+"\nindex "+id+"\n" {
		return false
	}
	index, err := os.ReadFile(indexPath)
	if err != nil {
		return false
	}
	var ifi syscall.Stat_t
	if syscall.Stat(indexPath, &ifi) != nil {
		return false
	}
	hashLen := 20
	if len(head) == 64 {
		hashLen = 32
	}
	paths, ok := indexMatches(wt.dir, index, hashLen, ifi.Mtim)
	return ok && nothingUntracked(wt.dir, paths)
}

// fileID is what identifies one version of the file at path: git writes
// a new index aside and renames it into place.
func fileID(path string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d %d %d.%09d", st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec), nil
}

// indexMatches reports whether every entry of the index (its file's
// content) matches the file in dir as git would judge it without reading
// it, and returns the entries' paths.
func indexMatches(dir string, index []byte, hashLen int, indexMtime syscall.Timespec) (map[string]bool, bool) {
	if len(index) < 12+hashLen || string(index[:4]) != "DIRC" {
		return nil, false
	}
	version := binary.BigEndian.Uint32(index[4:8])
	n := binary.BigEndian.Uint32(index[8:12])
	if version != 2 && version != 3 || n > maxCleanEntries {
		return nil, false
	}
	be := binary.BigEndian
	paths := make(map[string]bool, n)
	off := 12
	for range n {
		fixed := 40 + hashLen + 2
		if off+fixed > len(index) {
			return nil, false
		}
		e := index[off:]
		flags := be.Uint16(e[40+hashLen:])
		nameStart := fixed
		if flags&0x4000 != 0 {
			// Extended flags: skip-worktree, intent-to-add.
			return nil, false
		}
		if flags&0x3000 != 0 {
			return nil, false // a conflict
		}
		end := strings.IndexByte(string(e[nameStart:min(len(e), nameStart+4096)]), 0)
		if end < 0 {
			return nil, false
		}
		name := string(e[nameStart : nameStart+end])
		// Entries are padded with 1 to 8 NULs to a multiple of 8 bytes.
		off += (nameStart + end + 8) &^ 7
		if !entryMatches(dir, name, e, e[40:40+hashLen], indexMtime) {
			return nil, false
		}
		paths[name] = true
	}
	// Extensions a reader must understand (lower-case signature) change
	// what the entries mean: a split or sparse index.
	for off+8 <= len(index)-hashLen {
		sig := index[off : off+4]
		size := int(be.Uint32(index[off+4:]))
		if sig[0] >= 'a' && sig[0] <= 'z' {
			return nil, false
		}
		off += 8 + size
	}
	return paths, true
}

// entryMatches compares one index entry's stat data, and for a racily
// clean entry its object id, with the file's.
func entryMatches(dir, name string, e, oid []byte, indexMtime syscall.Timespec) bool {
	be := binary.BigEndian
	ctimeS, ctimeN := be.Uint32(e[0:]), be.Uint32(e[4:])
	mtimeS, mtimeN := be.Uint32(e[8:]), be.Uint32(e[12:])
	ino, mode := be.Uint32(e[20:]), be.Uint32(e[24:])
	uid, gid, size := be.Uint32(e[28:]), be.Uint32(e[32:]), be.Uint32(e[36:])
	path := filepath.Join(dir, filepath.FromSlash(name))
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return false
	}
	switch mode {
	case 0o100644, 0o100755:
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG || (st.Mode&0o100 != 0) != (mode == 0o100755) {
			return false
		}
	case 0o120000:
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			return false
		}
	default:
		return false // a submodule, or something newer
	}
	same := uint32(st.Ctim.Sec) == ctimeS && uint32(st.Ctim.Nsec) == ctimeN &&
		uint32(st.Mtim.Sec) == mtimeS && uint32(st.Mtim.Nsec) == mtimeN &&
		uint32(st.Ino) == ino && st.Uid == uid && st.Gid == gid && uint32(st.Size) == size
	if !same {
		return false
	}
	if int64(mtimeS) < indexMtime.Sec || int64(mtimeS) == indexMtime.Sec && int64(mtimeN) < indexMtime.Nsec {
		return true
	}
	// Racily clean: written in the same clock tick as the index (as in a
	// worktree just checked out), so a change in that tick would not show
	// in the stat data. Its content tells, as git does it.
	return blobMatches(path, mode, oid)
}

// blobMatches reports whether the file at path, stored as git would store
// it with no filters, is the blob oid. A file that needs a filter
// (line endings, LFS) does not match, and git is asked.
func blobMatches(path string, mode uint32, oid []byte) bool {
	var content []byte
	var err error
	if mode == 0o120000 {
		var target string
		target, err = os.Readlink(path)
		content = []byte(target)
	} else {
		content, err = os.ReadFile(path)
	}
	if err != nil {
		return false
	}
	var h hash.Hash
	switch len(oid) {
	case sha1.Size:
		h = sha1.New()
	case sha256.Size:
		h = sha256.New()
	default:
		return false
	}
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write(content)
	return bytes.Equal(h.Sum(nil), oid)
}

// nothingUntracked reports whether dir holds no file outside paths, but
// for its .git file and the task files under .orch/.
func nothingUntracked(dir string, paths map[string]bool) bool {
	clean := true
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
			return nil
		case rel == ".git":
			return nil
		case rel == ".orch" && d.IsDir():
			return filepath.SkipDir
		case d.IsDir():
			return nil
		case !paths[rel]:
			clean = false
			return filepath.SkipAll
		}
		return nil
	})
	return err == nil && clean
}

// Pristine reports, without git, that the worktree at dir, of project's
// clone, holds nothing of its own: its HEAD is the commit that
// refs/remotes/origin/<its branch> or refs/remotes/origin/<defaultBranch>
// names, so no commit of it is missing from the remotes, and it is known
// clean (knownClean), so nothing is uncommitted or untracked. It returns
// HEAD and the branch ("" when detached) with it. false says nothing:
// git is to be asked. A job whose agent changed nothing (a review, an
// answer, a no-op) ends this way, and saving its task's state then runs
// no git process.
func (w *Workspace) Pristine(project, dir, defaultBranch string) (head, branch string, ok bool) {
	gitDir, err := w.RepoDir(project)
	if err != nil {
		return "", "", false
	}
	own, err := worktreeGitDir(dir)
	if err != nil {
		return "", "", false
	}
	branch, head, err = worktreeHead(own, gitDir)
	if err != nil || !isOID(head) {
		return "", "", false
	}
	onRemote := false
	for _, b := range []string{branch, defaultBranch} {
		if b == "" {
			continue
		}
		if oid, err := readRef(gitDir, "refs/remotes/origin/"+b); err == nil && oid == head {
			onRemote = true
			break
		}
	}
	wt := worktree{dir: dir, gitDir: gitDir, own: own}
	if !onRemote || !wt.knownClean(head) {
		return "", "", false
	}
	return head, branch, true
}
