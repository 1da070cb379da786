package vm

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
)

// sharedDirs are the guest's copies of the directories a pod's containers
// bind-mount, one per host directory: what one container writes in an
// emptyDir (or any directory volume) the pod's other containers see, as
// under runc, where the bind is the same directory. A copy lives as long
// as the pod's VM, as an emptyDir lives as long as the pod. A copy of a
// volume kubelet updates in place is kept in step with it (volumeSync).
type sharedDirs struct {
	dir     string      // where the copies go in the guest
	agent   fileUpdater // nil: no volume is kept in step
	timeout time.Duration

	mu     sync.Mutex
	byHost map[string]string // host directory -> its copy in the guest
	n      int
	stop   chan struct{} // closed when the pod's VM ends
	closed bool
	wg     sync.WaitGroup
}

func newSharedDirs(dir string, a fileUpdater, timeout time.Duration) *sharedDirs {
	return &sharedDirs{dir: dir, agent: a, timeout: timeout, byHost: map[string]string{}, stop: make(chan struct{})}
}

// find returns the guest's copy of host directory src, if a container
// of the pod has it already.
func (s *sharedDirs) find(src string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.byHost[filepath.Clean(src)]
	return g, ok
}

// place returns where a new copy goes; it is the pod's once keep has it.
func (s *sharedDirs) place() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return path.Join(s.dir, fmt.Sprint(s.n))
}

// keep records copies the guest now has (a container carrying them, as
// files, was created), by host directory, and keeps those of live volumes
// in step until close.
func (s *sharedDirs) keep(ctx context.Context, copies map[string]string, files []agent.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for src, g := range copies {
		s.byHost[filepath.Clean(src)] = g
		if s.agent == nil || s.closed || !liveVolume.MatchString(src) {
			continue
		}
		v := newVolumeSync(src, g, s.agent, files)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			v.run(log.WithLogger(context.Background(), log.G(ctx)), s.stop, s.timeout)
		}()
	}
}

// close stops keeping volumes in step, and waits for a sync in progress.
func (s *sharedDirs) close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
}
