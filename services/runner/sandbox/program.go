package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// programArgs bind, read-only, what the agent's command runs: its program,
// looked up on PATH and its symlinks followed, and that program's
// interpreter (a script's #! line, through /usr/bin/env), as well as every
// argument that is an absolute path to a file (sh /path/agent.sh, node
// /path/cli.js). A file inside a Node package (a claude installed by npm
// under /usr/local/lib/node_modules or ~/.npm-global) brings its whole
// package directory; any other file comes alone. The path the command
// names is kept: a symlink there points at the bound file. Programs in the
// system directories are there already.
func programArgs(argv []string, path string) ([]string, error) {
	var args []string
	bound := map[string]bool{}
	bind := func(name string, lookup bool) error {
		files, err := resolve(name, path, lookup)
		if err != nil {
			return err
		}
		for _, f := range files {
			if bound[f.src] {
				continue
			}
			bound[f.src] = true
			if f.link != "" {
				args = append(args, "--symlink", f.src, f.link)
				continue
			}
			args = append(args, "--ro-bind", f.src, f.src)
		}
		return nil
	}
	if err := bind(argv[0], true); err != nil {
		return nil, fmt.Errorf("agent command %q: %w", argv[0], err)
	}
	for _, a := range argv[1:] {
		if !filepath.IsAbs(a) {
			continue
		}
		if fi, err := os.Stat(a); err == nil && fi.Mode().IsRegular() {
			if err := bind(a, false); err != nil {
				return nil, err
			}
		}
	}
	return args, nil
}

// file is one thing to put in the sandbox: src bound at the same path, or,
// when link is set, a symlink at link pointing to src.
type file struct{ src, link string }

// resolve lists what running name needs: its file (a package directory,
// see programArgs) and, for a script, its interpreter's.
func resolve(name, path string, lookup bool) ([]file, error) {
	found := name
	if lookup && !strings.Contains(name, "/") {
		p, err := lookPath(name, path)
		if err != nil {
			return nil, err
		}
		found = p
	}
	found, err := filepath.Abs(found)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(found)
	if err != nil {
		return nil, err
	}
	var files []file
	if !underSystem(real) {
		files = append(files, file{src: packageDir(real)})
		if real != found && !underSystem(found) {
			files = append(files, file{src: real, link: found})
		}
	}
	if interp := interpreter(real); interp != "" && interp != name {
		more, err := resolve(interp, path, true)
		if err != nil {
			return nil, fmt.Errorf("interpreter %q of %s: %w", interp, real, err)
		}
		files = append(files, more...)
	}
	return files, nil
}

// lookPath finds name on path (the agent's PATH, not the runner's).
func lookPath(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

// packageDir is the Node package directory holding file (the nearest
// directory with a package.json below a node_modules), or file itself.
func packageDir(file string) string {
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		parent := filepath.Dir(dir)
		if parent == dir {
			return file
		}
		if _, err := os.Stat(filepath.Join(dir, "package.json")); err == nil && slices.Contains(strings.Split(dir, "/"), "node_modules") {
			return dir
		}
	}
}

// interpreter is the program of file's #! line, with /usr/bin/env's
// argument in its place (#!/usr/bin/env node is node), or "".
func interpreter(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return ""
	}
	rest, ok := strings.CutPrefix(line, "#!")
	if !ok {
		return ""
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return ""
	}
	if filepath.Base(fields[0]) == "env" {
		for _, a := range fields[1:] {
			if !strings.HasPrefix(a, "-") {
				return a
			}
		}
		return ""
	}
	return fields[0]
}
