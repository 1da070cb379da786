package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// Process names the soak tells apart.
const (
	shimName        = "cocoon-shim-server"
	qemuPrefix      = "qemu-system-"
	containerdName  = "containerd"
	snapshotterName = "cocoon-snapshotter"
)

// proc is a process that refers to the stack's dir.
type proc struct {
	pid  int
	args []string
	cwd  string
}

func (p proc) name() string {
	if len(p.args) == 0 {
		return ""
	}
	return filepath.Base(p.args[0])
}

func (p proc) String() string {
	return fmt.Sprintf("pid %d: %s", p.pid, strings.Join(p.args, " "))
}

// isShimServer reports whether p is a shim's long-running task server, not
// a `delete` run of the binary or a spare waiting for a task.
func (p proc) isShimServer() bool {
	return p.name() == shimName && !p.isWaitingSpare() && p.args[len(p.args)-1] != "delete"
}

// isWaitingSpare reports whether p is a shim server started ahead of need
// (package spare) that has no task yet: it waits outside any bundle. Once
// it has one it keeps its command line but runs in the task's bundle.
func (p proc) isWaitingSpare() bool {
	return p.name() == shimName && spare.IsWaiting(p.args, p.cwd)
}

// sparePublished reports whether the waiting spare p is up: its start-up
// done, it watches containerd and has moved its socket to its slot's path.
func (p proc) sparePublished() bool {
	_, err := os.Stat(p.args[len(p.args)-1])
	return err == nil
}

// processesUsing lists the processes whose command line or working dir
// names dir or a path below it: the stack's daemons, shims and VMs.
func processesUsing(dir string) []proc {
	des, _ := os.ReadDir("/proc")
	var out []proc
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		cwd, _ := os.Readlink(filepath.Join("/proc", de.Name(), "cwd"))
		if refersTo(append(slices.Clone(args), cwd), dir) && !isZombie(pid) {
			out = append(out, proc{pid: pid, args: args, cwd: cwd})
		}
	}
	return out
}

func refersTo(strs []string, dir string) bool {
	for _, s := range strs {
		if s == dir || strings.Contains(s, dir+"/") {
			return true
		}
	}
	return false
}

// isZombie reports whether pid has exited and waits for its parent.
func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(f) == 0 || f[0] == "Z"
}

// findShim returns the task server of task id, if running: the one in the
// task's bundle (a server that began as a spare has no -id).
func findShim(dir, id string) (proc, bool) {
	for _, p := range processesUsing(dir) {
		if p.isShimServer() && filepath.Base(p.cwd) == id {
			return p, true
		}
	}
	return proc{}, false
}

// findQEMU returns the hypervisor whose command line names runDir.
func findQEMU(dir, runDir string) (proc, bool) {
	for _, p := range processesUsing(dir) {
		if strings.HasPrefix(p.name(), qemuPrefix) && refersTo(p.args, runDir) {
			return p, true
		}
	}
	return proc{}, false
}

// fds lists what pid's open descriptors point at, sockets named by their
// unix path when they have one.
func fds(pid int, unixPaths map[string]string) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(des))
	for _, de := range des {
		target, err := os.Readlink(filepath.Join(dir, de.Name()))
		if err != nil {
			continue
		}
		if path := unixPaths[target]; path != "" {
			target += " " + path
		}
		out = append(out, target)
	}
	slices.Sort(out)
	return out
}

// unixSocketPaths maps "socket:[inode]" to the unix socket's path, for
// the sockets that have one (/proc/net/unix of this network namespace).
func unixSocketPaths() map[string]string {
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) >= 8 {
			out["socket:["+f[6]+"]"] = f[7]
		}
	}
	return out
}
