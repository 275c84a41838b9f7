package project

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
)

// Big describes a generated repository: Files files on main, spread over
// directories of 500 (dir<NNN>/sub<NN>/file<NNNNN>.txt), and a history of
// Commits commits after the first, each changing three files.
type Big struct {
	Files   int
	Commits int
}

// SetupBig generates the repository as a bare repository at dir/big.git
// with `git fast-import` (seconds, where committing by hand would take
// minutes) and returns its path. Partial clones of it are allowed.
func SetupBig(ctx context.Context, dir string, b Big) (string, error) {
	repo := filepath.Join(dir, "big.git")
	if out, err := exec.CommandContext(ctx, "git", "init", "--quiet", "--bare", "-b", "main", repo).CombinedOutput(); err != nil {
		return "", fmt.Errorf("git init: %w: %s", err, out)
	}
	cmd := exec.CommandContext(ctx, "git", "fast-import", "--quiet")
	cmd.Dir = repo
	in, err := cmd.StdinPipe()
	if err != nil {
		return "", err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	werr := writeHistory(in, b)
	cerr := in.Close()
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("git fast-import: %w: %s", err, stderr.String())
	}
	if werr != nil || cerr != nil {
		return "", fmt.Errorf("feeding git fast-import: %v %v", werr, cerr)
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", repo, "config", "uploadpack.allowFilter", "true").CombinedOutput(); err != nil {
		return "", fmt.Errorf("git config: %w: %s", err, out)
	}
	return repo, nil
}

// bigPath is the path of file i.
func bigPath(i int) string {
	return fmt.Sprintf("dir%03d/sub%02d/file%05d.txt", i/500, (i/50)%10, i)
}

// bigContent is about 1 KB of text, distinct per file and version.
func bigContent(i, version int) string {
	var sb strings.Builder
	for l := range 16 {
		fmt.Fprintf(&sb, "file %d version %d line %d: the quick brown fox jumps over the lazy dog\n", i, version, l)
	}
	return sb.String()
}

func writeHistory(w io.Writer, b Big) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	data := func(s string) { fmt.Fprintf(bw, "data %d\n%s\n", len(s), s) }
	commit := func(n int, msg string) {
		fmt.Fprintf(bw, "commit refs/heads/main\ncommitter bench <bench@example.com> %d +0000\n", 1_700_000_000+n*60)
		data(msg)
	}
	commit(0, "initial: many files")
	for i := range b.Files {
		fmt.Fprintf(bw, "M 100644 inline %s\n", bigPath(i))
		data(bigContent(i, 0))
	}
	for c := 1; c <= b.Commits; c++ {
		commit(c, fmt.Sprintf("change %d", c))
		for k := range 3 {
			i := (c*7919 + k*104729) % b.Files
			fmt.Fprintf(bw, "M 100644 inline %s\n", bigPath(i))
			data(bigContent(i, c))
		}
	}
	return bw.Flush()
}

// DiskUsage is the bytes of disk the files under path take (du -sk).
func DiskUsage(ctx context.Context, path ...string) (int64, error) {
	out, err := exec.CommandContext(ctx, "du", append([]string{"-skc"}, path...)...).Output()
	if err != nil {
		return 0, fmt.Errorf("du %v: %w", path, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var kb int64
	if _, err := fmt.Sscan(lines[len(lines)-1], &kb); err != nil {
		return 0, fmt.Errorf("du output %q: %w", out, err)
	}
	return kb << 10, nil
}
