package server

import (
	"fmt"
	"os"
	"os/exec"
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
// thread has them and the child inherits them (see forker). rlimits belong
// to the whole agent, so the child is traced, stops right after its exec,
// and gets them there (prlimit): before it runs, though after the kernel
// laid out its memory with the agent's RLIMIT_STACK. A held process is
// stopped (SIGSTOP) before it is let go, and SIGCONT runs it; one let run
// while it forks is not stopped, and runs as soon as it is set up. Either
// way the process costs a plain fork and exec.
//
// Setting another user's rlimits takes CAP_SYS_RESOURCE, which the guest's
// agent has. An agent without it (in tests) sets them as the process's
// user instead, which may lower them as the process itself could.
type forked struct {
	cmd     *exec.Cmd
	execd   chan struct{} // closed once the exec is done or failed
	execErr error         // the exec's, valid once execd
	ready   chan struct{} // closed once the fork is over
	err     error         // the fork's, valid once ready

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
	f := &forked{cmd: cmd, hold: hold, execd: make(chan struct{}), ready: make(chan struct{})}
	j := forkJob{f: f, s: s, childEnds: childEnds}
	if fk := forkerFor(s); fk != nil {
		fk.jobs <- j
	} else {
		go j.alone()
	}
	return f
}

// wait returns the fork's result once it is over.
func (f *forked) wait() error {
	<-f.ready
	return f.err
}

// run lets the process run, once its exec is done: a process still being
// set up then runs as soon as it is (an rlimit that cannot be set kills
// it). It returns the exec's result.
func (f *forked) run() error {
	f.mu.Lock()
	f.hold = false
	held := f.held
	f.mu.Unlock()
	if <-f.execd; f.execErr != nil {
		return f.execErr
	}
	if !held {
		return nil
	}
	// SIGCONT continues the stopped process, or cancels its pending stop.
	if err := unix.Kill(f.cmd.Process.Pid, unix.SIGCONT); err != nil {
		return fmt.Errorf("let the process run: %w", err)
	}
	return nil
}

// failed ends a fork that could not start the process.
func (f *forked) failed(err error) {
	f.execErr, f.err = err, err
	close(f.execd)
}

// forkOnThread starts the process from this thread and sets it up; asUser
// lets the thread take the process's user to set its rlimits.
func (f *forked) forkOnThread(s *procSpec, childEnds []*os.File, asUser bool) error {
	defer closeAll(childEnds)
	f.execErr = f.cmd.Start()
	close(f.execd)
	if f.execErr != nil {
		return f.execErr
	}
	if err := f.setUp(s, asUser); err != nil {
		_ = f.cmd.Process.Kill()
		_ = f.cmd.Wait()
		return err
	}
	return nil
}

// setUp waits for the child's stop after its exec, sets its rlimits (as
// its user with asUser), stops it for good if held, and lets it go.
func (f *forked) setUp(s *procSpec, asUser bool) error {
	pid := f.cmd.Process.Pid
	if err := awaitExec(pid); err != nil {
		return err
	}
	if asUser && len(s.rlimits) > 0 {
		if err := actAs(s.uid, s.gid); err != nil {
			return err
		}
	}
	for _, l := range s.rlimits {
		if err := unix.Prlimit(pid, l.Resource, &unix.Rlimit{Cur: l.Soft, Max: l.Hard}, nil); err != nil {
			return fmt.Errorf("set %s to %d/%d: %w", l.Name, l.Soft, l.Hard, err)
		}
	}
	if err := f.stopIfHeld(pid); err != nil {
		return err
	}
	if err := unix.PtraceDetach(pid); err != nil {
		return fmt.Errorf("let the process go: %w", err)
	}
	return nil
}

// awaitExec waits for the traced child's stop after its exec (SIGTRAP),
// passing on any signal it got before.
func awaitExec(pid int) error {
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
			return fmt.Errorf("wait for the exec: %w", err)
		}
		switch {
		case !ws.Stopped():
			return fmt.Errorf("the process ended before it ran (%v): %w", ws, errdefs.ErrFailedPrecondition)
		case ws.StopSignal() == unix.SIGTRAP:
			return nil
		}
		if err := unix.PtraceCont(pid, int(ws.StopSignal())); err != nil {
			return fmt.Errorf("pass signal %v on to the process: %w", ws.StopSignal(), err)
		}
	}
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
