package manager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// killNaming SIGKILLs every process whose command line names a path in
// dir, and waits for each to exit. dir is a VM's run dir, which holds its
// sockets and logs, so this is the VM's hypervisor even when no pid was
// recorded: a shim killed between spawning it and recording it.
func killNaming(dir string) error {
	if dir == "" {
		return nil
	}
	// The driver makes the run dir before it spawns the hypervisor and
	// removes it only after killing it, so without the dir there is nothing
	// to find; that is every delete after a clean one (the VM's Close
	// removed it), which then skips reading every host process's cmdline.
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	des, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	var errs []error
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || pid == os.Getpid() || !names(pid, dir) {
			continue
		}
		if err := killIfNaming(pid, dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killIfNaming kills pid through a pidfd once it has checked that the
// process the pidfd pins still names dir, so a reused pid is never hit.
func killIfNaming(pid int, dir string) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !names(pid, dir) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill pid %d, which names %s: %w", pid, dir, err)
	}
	return waitPidfd(fd, pid)
}

// names reports whether pid's command line names dir or a path below it.
func names(pid int, dir string) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	for _, arg := range strings.Split(string(data), "\x00") {
		if arg == dir || strings.Contains(arg, dir+"/") {
			return true
		}
	}
	return false
}
