package server

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/seccomp"
)

// A process's seccomp filter goes on the thread that forks it (see
// forked): filters, like no_new_privileges, belong to a thread and pass to
// what it forks. So the filter already holds while the fork finishes and
// the child makes its way to exec, and on the thread while it sets the
// process up after (see setUp), where runc loads it just before the exec.
// The thread chroots and unshares the PID namespace itself, before the
// filter, so that no profile needs to allow those; what is left of the
// way is the calls below, which the profile must let through: one that
// refuses any is refused with the call named, before anything changes,
// rather than a start that fails half-way or a thread the filter kills.

// forkCalls are the calls made under the filter: the thread's fork, its
// wait for the exec and the set-up after (ptrace, prlimit, signals), the
// child's way from fork to exec (session, credentials, capabilities,
// dir, stdio, ptrace, exec), and the Go runtime's own on that thread.
var forkCalls = []string{
	"clone", "wait4", "waitid", "ptrace", "prlimit64", "kill", "tgkill", "pidfd_send_signal",
	"setresuid", "setresgid", "read", "write", "close", "pipe2", "fcntl", "openat", "epoll_ctl",
	"futex", "mmap", "munmap", "madvise", "rt_sigprocmask", "rt_sigreturn", "sigaltstack",
	"nanosleep", "sched_yield", "gettid", "getpid", "clock_gettime", "exit", "exit_group",
	"setsid", "setgroups", "setgid", "setuid", "capget", "capset", "prctl", "chdir", "dup3",
	"ioctl", "execve",
}

// forkCloneFlags are the flags of Go's fork: a vfork with a pidfd.
const forkCloneFlags = unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)

// newSeccomp reads and compiles a process's profile, and checks that it
// lets the process start; nil for none.
func newSeccomp(data []byte) (*seccomp.Filter, error) {
	if len(data) == 0 {
		return nil, nil
	}
	var profile specs.LinuxSeccomp
	if err := json.Unmarshal(data, &profile); err != nil {
		return nil, fmt.Errorf("seccomp profile: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	f, err := seccomp.Compile(&profile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := letsForkThrough(f); err != nil {
		return nil, err
	}
	return f, nil
}

// letsForkThrough checks f against forkCalls.
func letsForkThrough(f *seccomp.Filter) error {
	var calls []seccomp.Call
	var names []string
	for _, name := range forkCalls {
		var args []uint64
		if name == "clone" {
			args = []uint64{forkCloneFlags}
		}
		c, ok := seccomp.NativeCall(name, args...)
		if !ok {
			continue // not on this architecture (Go uses another)
		}
		calls, names = append(calls, c), append(names, name)
	}
	i, err := f.Refuses(calls)
	if err != nil {
		return fmt.Errorf("check seccomp profile: %w", err)
	}
	if i >= 0 {
		return fmt.Errorf("seccomp profile refuses %s, which starting the process takes under its filter (%s): %w",
			names[i], strings.Join(forkCalls, ", "), errdefs.ErrInvalidArgument)
	}
	return nil
}

// confineThread readies this thread, locked for good, to fork s's process
// under its filter: it chroots into the process's root and moves to a new
// PID namespace for its children when s asks (both before the filter, as
// runc does them before its), then loads the filter.
func confineThread(s *procSpec) error {
	if s.root != "" {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare the file system context: %w", err)
		}
		if err := unix.Chroot(s.root); err != nil {
			return fmt.Errorf("chroot into the container's root: %w", err)
		}
		if err := unix.Chdir("/"); err != nil {
			return fmt.Errorf("chdir to the container's root: %w", err)
		}
	}
	if s.ownPIDNamespace {
		settleForkCheck()
		if err := unix.Unshare(unix.CLONE_NEWPID); err != nil {
			return fmt.Errorf("unshare the PID namespace: %w", err)
		}
	}
	return s.seccomp.Load()
}

// settleForkCheck has os run, if it has not yet, its one check of whether
// clone gives a pidfd, which forks a child that exits at once. A thread
// whose children go to a new PID namespace must not run it: that child
// would be the namespace's init, and its exit would end the namespace
// before the process forks into it (ENOMEM). os.FindProcess runs it.
func settleForkCheck() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Release()
	}
}
