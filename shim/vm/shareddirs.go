package vm

import (
	"fmt"
	"path"
	"path/filepath"
	"sync"
)

// sharedDirs are the guest's copies of the directories a pod's containers
// bind-mount, one per host directory: what one container writes in an
// emptyDir (or any directory volume) the pod's other containers see, as
// under runc, where the bind is the same directory. A copy lives as long
// as the pod's VM, as an emptyDir lives as long as the pod.
type sharedDirs struct {
	dir string // where the copies go in the guest

	mu     sync.Mutex
	byHost map[string]string // host directory -> its copy in the guest
	n      int
}

func newSharedDirs(dir string) *sharedDirs {
	return &sharedDirs{dir: dir, byHost: map[string]string{}}
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

// keep records copies the guest now has (a container carrying them was
// created), by host directory.
func (s *sharedDirs) keep(copies map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for src, g := range copies {
		s.byHost[filepath.Clean(src)] = g
	}
}
