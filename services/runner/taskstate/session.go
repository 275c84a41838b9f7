package taskstate

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf16"
)

// claudeNameMax is how long a project directory name Claude Code keeps
// whole; a longer one is cut and given a hash of the whole path.
const claudeNameMax = 200

// ClaudeProjectName is the name Claude Code gives the directory of a
// working directory's sessions under <config dir>/projects: every
// character that is not an ASCII letter or digit becomes "-", and a name
// longer than 200 characters is cut to 200 and ends in "-" and the path's
// Java-style string hash in base 36. This is what Claude Code 2.1.197 does
// (its function for the projects directory), checked against the CLI:
// /tmp/h25/ws/wt/my.proj_x/task-1 is -tmp-h25-ws-wt-my-proj-x-task-1.
// The path is the working directory as the CLI sees it: its real path.
func ClaudeProjectName(path string) string {
	var b strings.Builder
	units := utf16.Encode([]rune(path))
	for _, u := range units {
		switch {
		case u >= 'a' && u <= 'z', u >= 'A' && u <= 'Z', u >= '0' && u <= '9':
			b.WriteByte(byte(u))
		default:
			// JavaScript's replace works on UTF-16 code units: a
			// character outside the BMP is two of them, so two dashes.
			b.WriteByte('-')
		}
	}
	name := b.String()
	if len(name) <= claudeNameMax {
		return name
	}
	var h int32
	for _, u := range units {
		h = 31*h + int32(u)
	}
	abs := int64(h)
	if abs < 0 {
		abs = -abs
	}
	return name[:claudeNameMax] + "-" + strconv.FormatInt(abs, 36)
}

// SessionDir is the directory of the sessions Claude Code keeps for the
// working directory worktree under its configuration directory
// configDir (CLAUDE_CONFIG_DIR, else $HOME/.claude).
func SessionDir(configDir, worktree string) string {
	if real, err := filepath.EvalSymlinks(worktree); err == nil {
		worktree = real
	}
	return filepath.Join(configDir, "projects", ClaudeProjectName(worktree))
}

// latestSession is the id of the session in dir whose transcript
// (<id>.jsonl) changed last, "" when there is none.
func latestSession(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	var id string
	var newest int64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".jsonl")
		if !ok || e.IsDir() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if t := fi.ModTime().UnixNano(); id == "" || t > newest {
			id, newest = name, t
		}
	}
	return id
}
