package check

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestRunnerFileList holds the runner package's comment, which walks a
// newcomer through its files in the order a job meets them, to the
// files there are: each of the package's Go files (not its tests) is
// named, and every file named exists.
func TestRunnerFileList(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(repoRoot, "services", "runner")
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, "runner.go"), nil, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatal("services/runner/runner.go has no package comment")
	}
	named := regexp.MustCompile(`\b[a-z0-9_]+\.go\b`).FindAllString(f.Doc.Text(), -1)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if name := e.Name(); !e.IsDir() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			files = append(files, name)
		}
	}
	for _, name := range files {
		if !slices.Contains(named, name) {
			t.Errorf("the runner's package comment (runner.go) does not name %s: say where it fits in the file list", name)
		}
	}
	for _, name := range named {
		if !slices.Contains(files, name) {
			t.Errorf("the runner's package comment (runner.go) names %s, which is not a file of the package", name)
		}
	}
}
