package share

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// keptCaps are what serving a directory as root takes: files of any owner
// read, written, chowned, chmod'ed and their times set, setgid bits kept,
// file capabilities set. The rest (CAP_SYS_ADMIN, which could mount the
// host's /proc, CAP_MKNOD, CAP_SYS_PTRACE...) go once the helper is
// confined.
var keptCaps = []uintptr{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH,
	unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_SETFCAP}

// KeptCapsMask is keptCaps as /proc/PID/status shows them (CapEff).
func KeptCapsMask() uint64 {
	var m uint64
	for _, c := range keptCaps {
		m |= 1 << c
	}
	return m
}

// dropPrivileges gives every thread of the helper no_new_privs and
// keptCaps alone (bounding, permitted and effective; none inheritable or
// ambient). Both are a thread's in Linux, so every thread is set
// (AllThreadsSyscall), which a binary that links cgo cannot do: the shim
// server is built without it (Makefile); a test binary that links it keeps
// its capabilities, and says so.
func dropPrivileges() error {
	err := allThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)
	if errors.Is(err, unix.ENOTSUP) {
		fmt.Fprintln(os.Stderr, "capabilities kept: this binary links cgo, which cannot drop them from every thread")
		return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	}
	if err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	kept := KeptCapsMask()
	for c := uintptr(0); c < 64; c++ {
		if kept&(1<<c) != 0 {
			continue
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); errors.Is(err, unix.EINVAL) {
			break // past the kernel's last capability
		} else if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
		return fmt.Errorf("clear the ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(kept), Permitted: uint32(kept)},
		{Effective: uint32(kept >> 32), Permitted: uint32(kept >> 32)},
	}
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}

func allThreads(trap, a1, a2, a3 uintptr) error {
	if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
		return e
	}
	return nil
}
