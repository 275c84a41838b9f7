package check

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layoutRoots are the trees whose every Go package the README's layout
// must name: the code a newcomer reads. deployments/ and bench/ are named
// by their parts, not package by package.
var layoutRoots = []string{"proto", "kit", "services"}

// readmeLayout reads the tree in the README's "## Layout" section and
// returns every directory it names, relative to the repository, in the
// order written. A line is an indent, then one or more names that each end
// in "/", then two spaces or more and what it holds; a name is relative
// to the name of the nearest line above that is indented less, and
// {a,b}/ stands for a/ and b/. A line of several names has no lines
// below it.
func readmeLayout(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Layout\n")
	if !ok {
		t.Fatal(`README.md has no "## Layout" section`)
	}
	_, block, ok := strings.Cut(section, "```\n")
	if !ok {
		t.Fatal("README's layout has no code block")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal("README's layout block is not closed")
	}
	named, errs := parseLayout(block)
	for _, e := range errs {
		t.Error(e)
	}
	return named
}

// parseLayout reads a layout tree (see readmeLayout) into the directories
// it names, and what it could not read.
func parseLayout(block string) (named, errs []string) {
	type level struct {
		indent int
		dir    string // "" for a line of several names
	}
	var parents []level
	for line := range strings.Lines(block) {
		line = strings.TrimRight(line, "\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		var names []string
		for _, f := range strings.Fields(line) {
			if !strings.HasSuffix(f, "/") {
				break
			}
			names = append(names, f)
		}
		if len(names) == 0 {
			errs = append(errs, fmt.Sprintf("README layout line %q names no directory: want names ending in / before the description", line))
			continue
		}
		for len(parents) > 0 && parents[len(parents)-1].indent >= indent {
			parents = parents[:len(parents)-1]
		}
		parent := ""
		if len(parents) > 0 {
			if parent = parents[len(parents)-1].dir; parent == "" {
				errs = append(errs, fmt.Sprintf("README layout line %q is under a line of several names: whose part is it?", line))
				continue
			}
		}
		var dirs []string
		for _, n := range names {
			for _, d := range expandBraces(n) {
				dirs = append(dirs, filepath.Join(parent, d))
			}
		}
		named = append(named, dirs...)
		own := ""
		if len(dirs) == 1 {
			own = dirs[0]
		}
		parents = append(parents, level{indent, own})
	}
	return named, errs
}

// expandBraces expands one {a,b,...} in a name: "x/{a,b}/" is "x/a/" and
// "x/b/".
func expandBraces(name string) []string {
	head, rest, ok := strings.Cut(name, "{")
	if !ok {
		return []string{name}
	}
	alts, tail, ok := strings.Cut(rest, "}")
	if !ok {
		return []string{name}
	}
	var out []string
	for _, a := range strings.Split(alts, ",") {
		out = append(out, head+a+tail)
	}
	return out
}

// goPackages returns every directory under root that holds a Go package
// with code of its own (a .go file that is not a test), as the go tool
// sees them: testdata and directories starting with "." or "_" are not
// packages.
func goPackages(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(repoRoot, root), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != filepath.Join(repoRoot, root) && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".go") && !strings.HasSuffix(d.Name(), "_test.go") {
			rel, err := filepath.Rel(repoRoot, filepath.Dir(path))
			if err != nil {
				return err
			}
			if len(out) == 0 || out[len(out)-1] != rel {
				out = append(out, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadmeLayout holds the README's layout to the tree: every Go
// package under proto/, kit/ and services/ has its line, and every
// directory the layout names exists, so the map a newcomer reads first
// is neither short of a package nor names one that has gone.
func TestReadmeLayout(t *testing.T) {
	t.Parallel()
	named := readmeLayout(t)
	if len(named) == 0 {
		t.Fatal("README's layout names nothing")
	}
	for _, dir := range named {
		if fi, err := os.Stat(filepath.Join(repoRoot, dir)); err != nil || !fi.IsDir() {
			t.Errorf("README's layout names %s/, which is not a directory of the repository", dir)
		}
	}
	for _, root := range layoutRoots {
		for _, pkg := range goPackages(t, root) {
			if !slices.Contains(named, pkg) {
				t.Errorf("README's layout does not name the package %s/: add a line for it", pkg)
			}
		}
	}
}

// The layout's reader takes the shapes the README writes: nesting by
// indent, several names on a line, braces, and a line it cannot place.
func TestReadmeLayoutReader(t *testing.T) {
	t.Parallel()
	named, errs := parseLayout(`
proto/             the wire contract
  joblog/          the log format
kit/               shared
  status/          lifecycle
    statustest/    records in any shape
  natstest/ testkit/  test helpers
services/
  gateway/         webhooks in
    cmd/gateway/   main
deployments/
  {docker,k8s}/
docs/              pages
`)
	want := []string{
		"proto", "proto/joblog", "kit", "kit/status", "kit/status/statustest",
		"kit/natstest", "kit/testkit", "services", "services/gateway",
		"services/gateway/cmd/gateway", "deployments", "deployments/docker",
		"deployments/k8s", "docs",
	}
	if !slices.Equal(named, want) || len(errs) != 0 {
		t.Errorf("parseLayout = %q, %q; want %q and no errors", named, errs, want)
	}
	for _, bad := range []string{
		"kit/\n  a/ b/  two\n    c/  under both\n",
		"kit/\n  no slash here\n",
	} {
		if _, errs := parseLayout(bad); len(errs) != 1 {
			t.Errorf("parseLayout(%q): errors %q, want one", bad, errs)
		}
	}
}
