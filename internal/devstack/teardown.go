package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Grace periods of the teardown.
const (
	deleteTimeout = 30 * time.Second
	stopTimeout   = 10 * time.Second
)

// Close deletes the containers left in the stack (so shims can stop their
// VMs), stops containerd and the snapshotter, kills by PID any process
// still referring to Dir (re-parented shims and the VMs they started),
// unmounts everything under Dir and removes it, and removes the namespace's
// cgroup dirs the stack's tasks created if they are empty. Calling it again
// is a no-op.
func (s *Stack) Close() error {
	if s.Dir == "" {
		return nil
	}
	var errs []error
	if _, err := os.Stat(s.Address); err == nil && len(s.procs) > 0 {
		if s.cri != nil {
			errs = append(errs, s.removePods())
		}
		errs = append(errs, deleteContainers(s.Address))
	}
	if s.client != nil {
		s.client.Close()
		s.client = nil
	}
	for i := len(s.procs) - 1; i >= 0; i-- {
		stop(s.procs[i])
	}
	errs = append(errs, sweep(s.Dir), removeEmptyCgroups(s.cgroups))
	s.Dir = ""
	return errors.Join(errs...)
}

// Destroy tears down a stack left running (a kept demo) from its dir alone:
// it deletes its containers, stops every process referring to dir, unmounts
// and removes it. dir must be a stack dir (/tmp/ctrd-*).
func Destroy(dir string) error {
	dir = filepath.Clean(dir)
	if filepath.Dir(dir) != "/tmp" || !strings.HasPrefix(filepath.Base(dir), dirPrefix) {
		return fmt.Errorf("destroy %s: not a devstack dir: want /tmp/%s*", dir, dirPrefix)
	}
	var errs []error
	if _, err := os.Stat(filepath.Join(dir, "c.sock")); err == nil {
		errs = append(errs, deleteContainers(filepath.Join(dir, "c.sock")))
	}
	terminate(processesUsing(dir))
	return errors.Join(append(errs, sweep(dir))...)
}

// sweep kills what still refers to dir, unmounts everything under it and
// removes it, and removes the CRI pods' cgroup parent named after it and
// the pooled VMs' cgroup.
func sweep(dir string) error {
	killAll(processesUsing(dir))
	err := unmountAll(dir)
	if rerr := os.RemoveAll(dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("remove %s: %w", dir, rerr))
	}
	cgroups := slices.Concat(hierarchyDirs(filepath.Base(dir)), hierarchyDirs(poolCgroup(dir)))
	return errors.Join(err, removeEmptyCgroups(cgroups))
}

// poolCgroup names the stack's pooled VMs' cgroup (shim.pool_cgroup), of
// its own: the node's default is shared by every containerd.
func poolCgroup(dir string) string { return filepath.Base(dir) + "-pool" }

// deleteContainers deletes every task and container of the containerd at
// address, in every namespace, with their snapshots.
func deleteContainers(address string) error {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	cl, err := client.New(address, client.WithTimeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("teardown: connect to containerd: %w", err)
	}
	defer cl.Close()
	nss, err := cl.NamespaceService().List(ctx)
	if err != nil {
		return fmt.Errorf("teardown: list namespaces: %w", err)
	}
	var errs []error
	for _, ns := range nss {
		errs = append(errs, deleteIn(namespaces.WithNamespace(ctx, ns), cl))
	}
	return errors.Join(errs...)
}

func deleteIn(ctx context.Context, cl *client.Client) error {
	ctrs, err := cl.Containers(ctx)
	if err != nil {
		return fmt.Errorf("teardown: list containers: %w", err)
	}
	var errs []error
	for _, c := range ctrs {
		if task, err := c.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, client.WithProcessKill); err != nil {
				errs = append(errs, fmt.Errorf("teardown: delete task %s: %w", c.ID(), err))
			}
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil {
			errs = append(errs, fmt.Errorf("teardown: delete container %s: %w", c.ID(), err))
		}
	}
	return errors.Join(errs...)
}

// stop asks a daemon to exit and kills it if it does not within stopTimeout.
func stop(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(stopTimeout):
	}
	log.L.WithField("pid", p.cmd.Process.Pid).Warnf("%s ignored SIGTERM for %s; killing it", p.name, stopTimeout)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// terminate sends SIGTERM to pids and waits up to stopTimeout for them.
func terminate(pids []int) {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGTERM)
	}
	waitGone(pids, stopTimeout)
}

// killAll sends SIGKILL to pids and waits for them to go.
func killAll(pids []int) {
	for _, pid := range pids {
		log.L.WithField("pid", pid).Info("teardown: killing leftover process")
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	waitGone(pids, stopTimeout)
}

func waitGone(pids []int, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, pid := range pids {
		for unix.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// processesUsing lists the other processes whose command line or working
// dir names dir or a path below it, or that sit in the stack's cgroup
// parent (a CRI pod's processes). dir is a fresh temp dir, so these can
// only be the stack's daemons, shims (re-parented to PID 1), VMs and pods.
func processesUsing(dir string) []int {
	var pids []int
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if refersTo(de.Name(), dir) || inCgroup(de.Name(), "/"+filepath.Base(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// refersTo reports whether process pid's command line or cwd names dir.
func refersTo(pid, dir string) bool {
	cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	cwd, _ := os.Readlink(filepath.Join("/proc", pid, "cwd"))
	for _, s := range append(strings.Split(string(cmdline), "\x00"), cwd) {
		if s == dir || strings.Contains(s, dir+"/") {
			return true
		}
	}
	return false
}

// inCgroup reports whether process pid is in cgroup parent or below it,
// in any hierarchy.
func inCgroup(pid, parent string) bool {
	data, _ := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	for _, line := range strings.Split(string(data), "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[2] == parent || strings.HasPrefix(parts[2], parent+"/")) {
			return true
		}
	}
	return false
}

// Leftovers describes what a torn-down stack left behind in dir (its Dir
// before Close): processes, mounts, its cgroup parent or the dir itself.
// Empty means clean.
func Leftovers(dir string) []string {
	var out []string
	for _, pid := range processesUsing(dir) {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	for _, mp := range mountsUnder(dir) {
		out = append(out, "mount "+mp)
	}
	for _, cg := range hierarchyDirs(filepath.Base(dir)) {
		if _, err := os.Lstat(cg); err == nil {
			out = append(out, "cgroup "+cg)
		}
	}
	if _, err := os.Lstat(dir); err == nil {
		out = append(out, "dir "+dir)
	}
	return out
}

// unmountAll detaches every mount under dir, deepest first.
func unmountAll(dir string) error {
	mps := mountsUnder(dir)
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
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
