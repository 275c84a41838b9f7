package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// wtStatus is a worktree as one `git status` sees it.
type wtStatus struct {
	head, branch string
	// tracked says tracked files changed (staged or not); untracked
	// lists the untracked files git does not ignore.
	tracked   bool
	untracked []string
}

func (s wtStatus) dirty() bool { return s.tracked || len(s.untracked) > 0 }

// readStatus reads the worktree's head, branch and changes in one git
// process (`git status --porcelain=v2`), where separate ones would cost a
// walk of the tree each.
func readStatus(ctx context.Context, wt string) (wtStatus, error) {
	var st wtStatus
	out, err := git(ctx, wt, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "-z")
	if err != nil {
		return st, fmt.Errorf("reading the worktree's status: %w", err)
	}
	toks := strings.Split(out, "\x00")
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch {
		case strings.HasPrefix(t, "# branch.oid "):
			st.head = strings.TrimPrefix(t, "# branch.oid ")
		case strings.HasPrefix(t, "# branch.head "):
			if b := strings.TrimPrefix(t, "# branch.head "); b != "(detached)" {
				st.branch = b
			}
		case strings.HasPrefix(t, "? "):
			st.untracked = append(st.untracked, t[2:])
		case strings.HasPrefix(t, "2 "):
			st.tracked = true
			i++ // a rename's original path follows
		case strings.HasPrefix(t, "1 "), strings.HasPrefix(t, "u "):
			st.tracked = true
		}
	}
	if st.head == "" || st.head == "(initial)" {
		return st, errors.New("the worktree has no commit")
	}
	return st, nil
}
