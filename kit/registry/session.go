package registry

import "fmt"

// The values of Project.Session.
const (
	// SessionContinue: a retry and the task's next job resume the agent's
	// last session of the task (Claude Code --resume), on whichever runner
	// takes them. The default.
	SessionContinue = "continue"
	// SessionFresh: every attempt starts a fresh session; the task's
	// work (commits, changes) is still carried over.
	SessionFresh = "fresh"
)

// Resumes says the project's jobs resume the agent's last session.
func (p *Project) Resumes() bool { return p.Session != SessionFresh }

func (p *Project) checkSession() error {
	switch p.Session {
	case "", SessionContinue, SessionFresh:
		return nil
	}
	return fmt.Errorf("project %q: session %q: want continue or fresh", p.Key, p.Session)
}
