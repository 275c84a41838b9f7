package agent

// Waiting is how many supervisors the pool holds ready for the next run:
// a test that counts on which supervisor runs its agent waits for it,
// since a supervisor's process is there a moment before it is ready.
func (p *Pool) Waiting() int { return len(p.ready) }

// CloseControl closes the runner's end of st's control socket, as the
// runner's death would, while the runner lives on (no Pdeathsig fires).
func (st *Started) CloseControl() { _ = st.sup.ctl.Close() }
