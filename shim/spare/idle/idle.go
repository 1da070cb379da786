// Package idle puts a spare task server under SCHED_IDLE as its process
// starts, so its start-up takes only CPU time nothing else wants, never the
// task just started. The server imports it for that effect.
//
// The spare is forked under the normal policy and demotes itself here, not
// forked from a thread under SCHED_IDLE: a forked child holds a copy of
// every descriptor of its parent, a task server that may hold a task's
// network namespace, disks and pipes, until it execs, and on a busy node a
// child under SCHED_IDLE may wait seconds for the CPU to exec (a namespace
// then cannot be unmounted: EBUSY). This package depends on the standard
// library's os and syscall only, so it is initialised before the server's
// other packages (Go initialises, among packages ready, the first by import
// path), which are most of a start-up (~45 ms here).
package idle

import (
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// Flag, as the server binary's first argument, makes it a spare; the path
// of its socket follows.
const Flag = "-spare"

// Env, set to "1" in a spare's environment, has it start under SCHED_IDLE;
// its starter sets it only where the spare may return to the normal policy
// (CAP_SYS_NICE, or an RLIMIT_NICE that allows nice 0).
const Env = "COCOON_SPARE_IDLE"

// schedIdle is SCHED_IDLE (sched(7)); package syscall does not name it.
const schedIdle = 5

func init() {
	if len(os.Args) == 3 && os.Args[1] == Flag && os.Getenv(Env) == "1" {
		// Best effort: a spare that cannot demote itself starts normally.
		_ = demote()
	}
}

// demote puts every thread of this process under SCHED_IDLE; threads
// started later inherit it from the thread that starts them.
func demote() error {
	des, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	var param struct{ priority int32 }
	for _, de := range des {
		tid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(tid), schedIdle, uintptr(unsafe.Pointer(&param)))
		if errno != 0 && errno != syscall.ESRCH {
			return errno
		}
	}
	return nil
}
