package taskstate

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tarFiles writes the files rel (paths relative to root, "/"-separated)
// into a tar at out: regular files and symbolic links, as they are; a
// path that is gone by now (the agent runs meanwhile) is left out.
func tarFiles(out, root string, rel []string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, name := range rel {
		if err := addFile(tw, root, name); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tarDir writes the tree under root into a tar at out, its paths relative
// to root.
func tarDir(out, root string) error {
	var rel []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		r, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = append(rel, filepath.ToSlash(r))
		return nil
	})
	if err != nil {
		return err
	}
	return tarFiles(out, root, rel)
}

func addFile(tw *tar.Writer, root, name string) error {
	path := filepath.Join(root, filepath.FromSlash(name))
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if link, err = os.Readlink(path); err != nil {
			return err
		}
	case !fi.Mode().IsRegular():
		return nil // sockets, fifos: nothing to carry
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
	if fi.Mode().IsRegular() {
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		defer f.Close()
		// The size is the header's: a file that grows meanwhile is cut,
		// one that shrinks fails the save (the next one takes it).
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	}
	return tw.WriteHeader(hdr)
}

// untar writes the tar at in under root. Every path must stay inside
// root: a tar that names another is refused, as a corrupt state.
func untar(in, root string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnreadable, err)
		}
		if !filepath.IsLocal(filepath.FromSlash(hdr.Name)) || strings.Contains(hdr.Name, "\\") {
			return fmt.Errorf("%w: path %q outside its directory", ErrUnreadable, hdr.Name)
		}
		path := filepath.Join(root, filepath.FromSlash(hdr.Name))
		if err := noLinkBetween(root, path); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		_ = os.Remove(path)
		switch hdr.Typeflag {
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, path); err != nil {
				return err
			}
		case tar.TypeReg:
			out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fs.FileMode(hdr.Mode)&0o777|0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return fmt.Errorf("%w: %v", ErrUnreadable, err)
			}
			if err := out.Close(); err != nil {
				return err
			}
			_ = os.Chtimes(path, hdr.ModTime, hdr.ModTime)
		}
	}
}

// noLinkBetween refuses a path under root that goes through a symbolic
// link: a tar with a link and then a file beneath it would write outside
// root.
func noLinkBetween(root, path string) error {
	rel, err := filepath.Rel(root, filepath.Dir(path))
	if err != nil || rel == "." {
		return err
	}
	dir := root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: path %q goes through the link %s", ErrUnreadable, path, dir)
		}
	}
	return nil
}
