package ctrdtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Cleanup deletes the containers left in Namespace (so shims can stop their
// VMs), stops containerd and the snapshotter, kills by PID any process still
// referring to Dir (re-parented shims and the VMs they started), unmounts
// everything under Dir and removes it. Start registers it with t; calling
// it again is a no-op.
func (c *Containerd) Cleanup() {
	if c.Dir == "" {
		return
	}
	if c.t.Failed() {
		c.t.Log(c.Logs())
	}
	c.deleteContainers()
	if c.client != nil {
		c.client.Close()
		c.client = nil
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.stop(c.procs[i])
	}
	c.killStragglers()
	c.unmountAll()
	if err := os.RemoveAll(c.Dir); err != nil {
		c.t.Errorf("remove %s: %v", c.Dir, err)
	}
	c.Dir = ""
}

func (c *Containerd) deleteContainers() {
	if len(c.procs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.New(c.Address, client.WithDefaultNamespace(Namespace), client.WithTimeout(5*time.Second))
	if err != nil {
		c.t.Logf("cleanup: connect to containerd: %v", err)
		return
	}
	defer cl.Close()
	ctrs, err := cl.Containers(ctx)
	if err != nil {
		c.t.Logf("cleanup: list containers: %v", err)
		return
	}
	for _, ctr := range ctrs {
		if task, err := ctr.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, client.WithProcessKill); err != nil {
				c.t.Logf("cleanup: delete task %s: %v", ctr.ID(), err)
			}
		}
		if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
			c.t.Logf("cleanup: delete container %s: %v", ctr.ID(), err)
		}
	}
}

// stop asks a process to exit and kills it if it does not within 10s.
func (c *Containerd) stop(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	c.t.Logf("cleanup: %s (pid %d) ignored SIGTERM for 10s; killing it", p.name, p.cmd.Process.Pid)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// killStragglers kills the processes whose command line or working dir
// names Dir. Dir is a fresh temp dir, so these can only be shims and VMs of
// this containerd (shims re-parent to PID 1 and outlive it).
func (c *Containerd) killStragglers() {
	pids := processesUsing(c.Dir)
	for _, pid := range pids {
		c.t.Logf("cleanup: killing leftover pid %d", pid)
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for unix.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// processesUsing lists the other processes whose command line or working
// dir names dir or a path below it.
func processesUsing(dir string) []int {
	var pids []int
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		cwd, _ := os.Readlink(filepath.Join("/proc", de.Name(), "cwd"))
		for _, s := range append(strings.Split(string(cmdline), "\x00"), cwd) {
			if s == dir || strings.Contains(s, dir+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// Leftovers describes what a torn-down harness left behind in dir (its Dir
// before Cleanup): processes, mounts or the dir itself. Empty means clean.
func Leftovers(dir string) []string {
	var out []string
	for _, pid := range processesUsing(dir) {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	for _, mp := range mountsUnder(dir) {
		out = append(out, "mount "+mp)
	}
	if _, err := os.Lstat(dir); err == nil {
		out = append(out, "dir "+dir)
	}
	return out
}

// unmountAll detaches every mount under Dir, deepest first.
func (c *Containerd) unmountAll() {
	mps := mountsUnder(c.Dir)
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			c.t.Errorf("cleanup: unmount %s: %v", mp, err)
		}
	}
}

// mountsUnder lists the mount points at or below dir in this mount namespace.
func mountsUnder(dir string) []string {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	return out
}
