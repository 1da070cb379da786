package server

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// forked is a process being forked and exec'd, with what Go's fork cannot
// give it, up to its first instruction: there it runs, or, held, stays
// stopped until it is let run.
//
// Go cannot run code between fork and exec, so the process gets the rest
// another way. no_new_privileges and the umask belong to a thread (the
// umask once the thread unshares its file system context): the forking
// thread takes them and the child inherits them; the thread then ends
// with its goroutine, never to run Go code again. rlimits belong to the
// whole agent, so the child is traced, stops right after its exec, and
// gets them there (prlimit): before it runs, though after the kernel laid
// out its memory with the agent's RLIMIT_STACK. A held process is stopped
// (SIGSTOP) before it is let go, and SIGCONT runs it; one let run while it
// forks is not stopped. Either way the process costs a plain fork and
// exec.
//
// Setting another user's rlimits takes CAP_SYS_RESOURCE, which the guest's
// agent has. An agent without it (in tests) sets them as the process's
// user instead, which may lower them as the process itself could.
type forked struct {
	cmd   *exec.Cmd
	ready chan struct{} // closed once the fork is over
	err   error         // the fork's, valid once ready

	mu   sync.Mutex
	hold bool // the process is to wait for run, which clears it
	held bool // the fork stopped the process for run
}

// forkProcess starts forking cmd with s's no_new_privileges, umask and
// rlimits, and closes childEnds (the child's copies of its stdio) once
// the child has its own; wait says how it went. A held process waits for
// run.
func forkProcess(cmd *exec.Cmd, s *procSpec, hold bool, childEnds []*os.File) *forked {
	cmd.SysProcAttr.Ptrace = true
	f := &forked{cmd: cmd, hold: hold, ready: make(chan struct{})}
	go f.fork(s, childEnds)
	return f
}

// wait returns the fork's result once it is over.
func (f *forked) wait() error {
	<-f.ready
	return f.err
}

// run lets the process run once its fork is over, and returns the fork's
// result.
func (f *forked) run() error {
	f.mu.Lock()
	f.hold = false
	f.mu.Unlock()
	if err := f.wait(); err != nil || !f.held {
		return err
	}
	if err := unix.Kill(f.cmd.Process.Pid, unix.SIGCONT); err != nil {
		return fmt.Errorf("let the process run: %w", err)
	}
	return nil
}

// fork runs on a thread of its own, which it leaves to die if it gave the
// thread what the process inherits.
func (f *forked) fork(s *procSpec, childEnds []*os.File) {
	defer close(f.ready)
	runtime.LockOSThread()
	var tookUser bool
	tookUser, f.err = f.forkOnThread(s, childEnds)
	if !s.noNewPrivileges && s.umask == nil && !tookUser {
		runtime.UnlockOSThread()
	}
}

func (f *forked) forkOnThread(s *procSpec, childEnds []*os.File) (tookUser bool, err error) {
	defer closeAll(childEnds)
	if s.umask != nil {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return false, fmt.Errorf("set the umask: %w", err)
		}
		unix.Umask(int(*s.umask))
	}
	if s.noNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return false, fmt.Errorf("set no_new_privileges: %w", err)
		}
	}
	if err := f.cmd.Start(); err != nil {
		return false, err
	}
	if tookUser, err = f.setUp(s); err != nil {
		_ = f.cmd.Process.Kill()
		_ = f.cmd.Wait()
	}
	return tookUser, err
}

// setUp waits for the child's stop after its exec, sets its rlimits, stops
// it for good if held, and lets it go.
func (f *forked) setUp(s *procSpec) (tookUser bool, err error) {
	pid := f.cmd.Process.Pid
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		return false, fmt.Errorf("wait for the exec: %w", err)
	}
	if !ws.Stopped() {
		return false, fmt.Errorf("the process ended before it ran (%v): %w", ws, errdefs.ErrFailedPrecondition)
	}
	for _, l := range s.rlimits {
		lim := &unix.Rlimit{Cur: l.Soft, Max: l.Hard}
		err := unix.Prlimit(pid, l.Resource, lim, nil)
		if errors.Is(err, unix.EPERM) && !tookUser && (s.uid != 0 || s.gid != 0) {
			if err = actAs(s.uid, s.gid); err == nil {
				tookUser = true
				err = unix.Prlimit(pid, l.Resource, lim, nil)
			}
		}
		if err != nil {
			return tookUser, fmt.Errorf("set %s to %d/%d: %w", l.Name, l.Soft, l.Hard, err)
		}
	}
	if err := f.stopIfHeld(pid); err != nil {
		return tookUser, err
	}
	if err := unix.PtraceDetach(pid); err != nil {
		return tookUser, fmt.Errorf("let the process go: %w", err)
	}
	return tookUser, nil
}

// stopIfHeld stops a process still held: pending when the trace ends,
// SIGSTOP stops it before its first instruction.
func (f *forked) stopIfHeld(pid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.hold {
		return nil
	}
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		return fmt.Errorf("hold the process: %w", err)
	}
	f.held = true
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
