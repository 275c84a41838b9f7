package workspace

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The in-process ref reader answers as git does, for loose, packed,
// symbolic and missing refs, and for a name that is a directory of refs.
func TestReadRefAgreesWithGit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := CreateRepo(ctx, repo, "main", map[string]string{"a.txt": "a\n"}); err != nil {
		t.Fatal(err)
	}
	bare := filepath.Join(dir, "bare.git")
	run := func(dir string, args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run(dir, "clone", "-q", "--bare", repo, bare)
	run(bare, "branch", "feature/packed", "main")
	run(bare, "pack-refs", "--all", "--prune")
	run(bare, "branch", "feature/loose", "main")
	run(bare, "symbolic-ref", "refs/heads/sym", "refs/heads/feature/loose")

	for _, ref := range []string{"HEAD", "refs/heads/main", "refs/heads/feature/packed", "refs/heads/feature/loose",
		"refs/heads/sym", "refs/heads/feature", "refs/heads/missing", "refs/remotes/origin/main"} {
		want := ""
		if out, err := exec.Command("git", "-C", bare, "rev-parse", "--verify", "--quiet", ref).Output(); err == nil {
			want = strings.TrimSpace(string(out))
		}
		got, err := readRef(bare, ref)
		if err != nil || got != want {
			t.Errorf("readRef(%s) = %q, %v; git says %q", ref, got, err, want)
		}
	}
	if _, err := readRef(bare, "refs/../config"); err == nil {
		t.Error("readRef read a path outside refs/")
	}
}
