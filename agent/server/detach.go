package server

import (
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/procio"
)

// detachAll forgets every process the agent tracks: Init runs once per
// restore, and the processes a clone inherits from its snapshot belong to
// the task that was snapshotted (a fork or hibernate), not to the clone's,
// whose shim starts its own "init" and execs. They keep running: their
// stdin is closed and their output drained and dropped, so none blocks
// on a pipe nobody reads. One prepared but never started is killed.
func (s *Service) detachAll() {
	s.mu.Lock()
	procs := s.procs
	s.procs = map[string]*process{}
	s.mu.Unlock()
	for id, p := range procs {
		if p.discard() {
			p.closeParentEnds()
			continue
		}
		if err := p.closeStdin(); err != nil {
			log.L.WithError(err).WithField("id", id).Warn("close stdin of a detached process")
		}
		for _, out := range []*procio.Output{p.stdout, p.stderr} {
			if out != nil {
				go out.Drain()
			}
		}
		log.L.WithField("id", id).WithField("pid", p.pid()).Info("process from the snapshot detached")
	}
}
