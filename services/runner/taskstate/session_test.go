package taskstate

import "testing"

// The names are those Claude Code 2.1.197 gave the directories of
// sessions run in these working directories (checked with the CLI against
// the stand-in API): a long path is cut to 200 characters and ends in its
// hash.
func TestClaudeProjectName(t *testing.T) {
	for path, want := range map[string]string{
		"/tmp/h25/ws/wt/my.proj_x/task-1": "-tmp-h25-ws-wt-my-proj-x-task-1",
		"/tmp/h25/ws/very-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_namevery-long.directory_name/wt": "-tmp-h25-ws-very-long-directory-namevery-long-directory-namevery-long-directory-namevery-long-directory-namevery-long-directory-namevery-long-directory-namevery-long-directory-namevery-long-directory--8b02x8",
		"/w/é": "-w--",
	} {
		if got := ClaudeProjectName(path); got != want {
			t.Errorf("ClaudeProjectName(%q) = %q, want %q", path, got, want)
		}
	}
}
