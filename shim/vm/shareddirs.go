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
// bind-mount and the VM does not share (shares): Kubernetes' live volumes,
// kept in step with the host's (live), and memory-backed emptyDirs, a
// tmpfs in the guest. One per host directory: what one container writes
// there the pod's other containers see, as under runc, where the bind is
// the same directory. A copy lives as long as the pod's VM, as an emptyDir
// lives as long as the pod.
type sharedDirs struct {
	dir  string // where the copies go in the guest
	live *liveVolumes
	// shares serve the directories the guest sees live instead (nil:
	// the guest's agent cannot): the VM's.
	shares *vmShares

	mu     sync.Mutex
	byHost map[string]string // host directory -> its copy in the guest
	n      int
}

func newSharedDirs(dir string, live *liveVolumes) *sharedDirs {
	return &sharedDirs{dir: dir, live: live, byHost: map[string]string{}}
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
// in step.
func (s *sharedDirs) keep(ctx context.Context, copies map[string]string, files []agent.File) {
	s.mu.Lock()
	for src, g := range copies {
		s.byHost[filepath.Clean(src)] = g
	}
	s.mu.Unlock()
	if s.live != nil {
		s.live.watch(ctx, copies, files)
	}
}

// liveVolumes keeps the guest's copies of live volumes (liveVolume) in
// step with the host's until close: the pod's for a pod's VM, the
// container's for a VM of its own.
type liveVolumes struct {
	agent   fileUpdater
	timeout time.Duration
	copies  *copyBudget // the VM's, which a new version of a volume takes from

	mu     sync.Mutex
	stop   chan struct{} // closed when the VM's guest closes
	closed bool
	wg     sync.WaitGroup
}

func newLiveVolumes(a fileUpdater, timeout time.Duration, copies *copyBudget) *liveVolumes {
	return &liveVolumes{agent: a, timeout: timeout, copies: copies, stop: make(chan struct{})}
}

// watch starts keeping in step the live volumes among copies (host
// directory -> its copy in the guest, made of files), and says how many.
func (l *liveVolumes) watch(ctx context.Context, copies map[string]string, files []agent.File) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for src, g := range copies {
		if l.closed || !liveVolume.MatchString(src) {
			continue
		}
		n++
		v := newVolumeSync(src, g, l.agent, l.copies, files)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			v.run(log.WithLogger(context.Background(), log.G(ctx)), l.stop, l.timeout)
		}()
	}
	return n
}

// close stops keeping volumes in step, and waits for a sync in progress.
func (l *liveVolumes) close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.stop)
	}
	l.mu.Unlock()
	l.wg.Wait()
}
