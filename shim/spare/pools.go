package spare

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PoolPrefix begins the id of a pooled VM (its run dir, its base
// snapshot's key); the pid of the spare that restored it follows.
const PoolPrefix = "pool-"

// SweepPools removes the run dirs under parent of pooled VMs whose spare
// is gone (killed, its VM dead with it, before it closed the VM), and one
// of this process's pid, which is older than this process. Both a spare's
// fill and a task's `shim delete` sweep: the latter also covers a spare
// killed as the last of a run, after which no fill comes.
func SweepPools(parent string) error {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), PoolPrefix))
		if !strings.HasPrefix(e.Name(), PoolPrefix) || err != nil {
			continue
		}
		if pid != os.Getpid() && Runs(pid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove the run dir of a dead spare's pooled VM: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Runs says whether pid is a spare task server (or one that became a
// task's, which keeps the spare's command line), not a zombie: the owner
// of a pooled VM's run dir.
func Runs(pid int) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) == 0 || f[0] == "Z" {
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	args := strings.Split(string(cmdline), "\x00")
	return err == nil && len(args) > 1 && args[1] == Flag
}
