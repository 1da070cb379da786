package server

import (
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// forker forks processes (see forked) from a thread of its own that lives
// as long as the agent: the thread has its own file system context, whose
// umask it sets for each process, and no_new_privileges when its processes
// have it. The agent makes its forkers as it starts (warmUp), so a
// snapshot carries their threads: a restored clone starts its process
// without making or ending a thread, code its CPU would translate anew.
type forker struct {
	jobs chan forkJob
}

// forkJob is one process for a forker.
type forkJob struct {
	f         *forked
	s         *procSpec
	childEnds []*os.File
}

// forkers are the agent's two forkers, without and with
// no_new_privileges; nil where the thread could not be set up.
var forkers = sync.OnceValue(func() [2]*forker {
	return [2]*forker{newForker(false), newForker(true)}
})

// forkerFor is the forker for s; nil when s's process must fork on a
// thread of its own: its rlimits are set as its user (see forked), which
// no thread can stop being, or it has capabilities, a seccomp filter or a
// mount namespace of its own, which no thread gives back once it has them.
func forkerFor(s *procSpec) *forker {
	if s.caps != nil || s.seccomp != nil || s.mountNS != nil || len(s.rlimits) > 0 && (s.uid != 0 || s.gid != 0) && !canSetRlimits() {
		return nil
	}
	if s.noNewPrivileges {
		return forkers()[1]
	}
	return forkers()[0]
}

// canSetRlimits says whether the agent has CAP_SYS_RESOURCE, which
// setting another user's rlimits takes.
var canSetRlimits = sync.OnceValue(func() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_RESOURCE/32].Effective&(1<<(unix.CAP_SYS_RESOURCE%32)) != 0
})

func newForker(nnp bool) *forker {
	fk := &forker{jobs: make(chan forkJob, 8)}
	up := make(chan error)
	go fk.serve(nnp, up)
	if err := <-up; err != nil {
		return nil
	}
	return fk
}

// serve forks fk's jobs on its thread, for good.
func (fk *forker) serve(nnp bool, up chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread keeps what it takes
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		runtime.UnlockOSThread()
		up <- fmt.Errorf("unshare the forker's file system context: %w", err)
		return
	}
	if nnp {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			up <- fmt.Errorf("set no_new_privileges: %w", err)
			return
		}
	}
	umask := unix.Umask(0o022)
	unix.Umask(umask)
	up <- nil
	for j := range fk.jobs {
		mask := umask
		if j.s.umask != nil {
			mask = int(*j.s.umask)
		}
		unix.Umask(mask)
		j.f.err = j.f.forkOnThread(j.s, j.childEnds, false)
		close(j.f.ready)
	}
}

// alone forks j on a thread of its own, which ends with it: it takes j's
// no_new_privileges and umask, and the process's user to set its rlimits.
func (j forkJob) alone() {
	defer close(j.f.ready)
	runtime.LockOSThread() // never unlocked: the thread dies with what it took
	if err := takeSettings(j.s); err != nil {
		closeAll(j.childEnds)
		j.f.failed(err)
		return
	}
	j.f.err = j.f.forkOnThread(j.s, j.childEnds, true)
}

// takeSettings gives this thread s's mount namespace, umask,
// no_new_privileges, capabilities and, last, seccomp filter.
func takeSettings(s *procSpec) error {
	if s.mountNS != nil {
		if err := enterGuestRoot(s.mountNS); err != nil {
			return err
		}
	}
	if s.umask != nil {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("set the umask: %w", err)
		}
		unix.Umask(int(*s.umask))
	}
	if s.noNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privileges: %w", err)
		}
	}
	if s.caps != nil {
		if err := s.caps.take(); err != nil {
			return err
		}
	}
	if s.seccomp != nil {
		return confineThread(s)
	}
	return nil
}

// actAs makes this thread's ids uid and gid (raw system calls: Go's would
// change every thread's).
func actAs(uid, gid uint32) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return fmt.Errorf("take gid %d: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return fmt.Errorf("take uid %d: %w", uid, e)
	}
	return nil
}
