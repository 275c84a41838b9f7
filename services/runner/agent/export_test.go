package agent

// Waiting is how many supervisors the pool holds ready for the next run:
// a test that counts on which supervisor runs its agent waits for it,
// since a supervisor's process is there a moment before it is ready.
func (p *Pool) Waiting() int { return len(p.ready) }
