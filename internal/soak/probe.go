package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// Count names, in the order a census lists them.
const (
	CountShims         = "shim processes"
	CountSpares        = "spares waiting"
	CountQEMU          = "QEMU processes"
	CountOtherProcs    = "other processes"
	CountContainerdFDs = "containerd fds"
	CountSnapshotFDs   = "snapshotter fds"
	CountMounts        = "mounts"
	CountLoops         = "loop devices"
	CountStaged        = "staged dirs"
	CountSnapshotDirs  = "snapshot dirs"
	CountFlatLinks     = "flat-file links"
	CountCgroups       = "cgroups"
	CountRunDirs       = "run dirs"
	CountBundles       = "bundles"
	CountShimSockets   = "shim sockets"
	CountFIFOs         = "fifos"
	CountTaps          = "taps"
	CountNetNS         = "network namespaces"
	CountLeases        = "leases"
	CountSnapshots     = "snapshots (containerd)"
	CountSnapshotterDB = "snapshots (snapshotter)"
	CountContainers    = "containers"
	CountTasks         = "tasks"
)

// take counts everything the soak watches.
func (s *soak) take(ctx context.Context) (Census, error) {
	procs := processesUsing(s.stack.Dir)
	c := s.processCounts(procs)
	c = append(c,
		itemsCount(CountMounts, mountsUnder(s.stack.Dir)),
		itemsCount(CountLoops, loopsUnder(s.stack.Dir)),
		itemsCount(CountStaged, stagedDirs(s.snapshotDir())),
		itemsCount(CountSnapshotDirs, dirEntries(s.snapshotDir(), 1)),
		flatLinks(filepath.Join(s.stack.SnapshotterRoot, "flat")),
		itemsCount(CountCgroups, cgroupsOf(s.stack.Namespace)),
		itemsCount(CountRunDirs, dirEntries(s.stack.RunDir, 2)),
		itemsCount(CountBundles, dirEntries(filepath.Join(s.stack.State, "io.containerd.runtime.v2.task"), 2)),
		itemsCount(CountShimSockets, shimSockets(filepath.Join(s.stack.Dir, "s"))),
		itemsCount(CountFIFOs, dirEntries(s.stack.FifoDir, 2)),
	)
	taps, netns, err := s.network(procs)
	if err != nil {
		return nil, err
	}
	c = append(c, itemsCount(CountTaps, taps), itemsCount(CountNetNS, netns))
	ctrd, err := s.containerdCounts(ctx)
	if err != nil {
		return nil, err
	}
	return append(c, ctrd...), nil
}

func itemsCount(name string, items []string) Count {
	return Count{Name: name, Value: len(items), Items: items}
}

func (s *soak) snapshotDir() string { return filepath.Join(s.stack.SnapshotterRoot, "snapshots") }

// processCounts are the shims, VMs and other processes of the stack (its
// daemons aside), and the daemons' open descriptors.
func (s *soak) processCounts(procs []proc) Census {
	var shims, spares, vms, others, ctrdFDs, snFDs []string
	paths := unixSocketPaths()
	for _, p := range procs {
		switch {
		case p.isWaitingSpare():
			// Started ahead of the next task, by the last one; counted
			// once up: then it holds a connection to containerd.
			if p.sparePublished() {
				spares = append(spares, p.String())
			}
		case p.name() == shimName:
			shims = append(shims, p.String())
		case strings.HasPrefix(p.name(), qemuPrefix):
			vms = append(vms, p.String())
		case p.name() == containerdName:
			ctrdFDs = append(ctrdFDs, fds(p.pid, paths)...)
		case p.name() == snapshotterName:
			snFDs = append(snFDs, fds(p.pid, paths)...)
		default:
			others = append(others, p.String())
		}
	}
	return Census{
		itemsCount(CountShims, shims),
		itemsCount(CountSpares, spares),
		itemsCount(CountQEMU, vms),
		itemsCount(CountOtherProcs, others),
		itemsCount(CountContainerdFDs, ctrdFDs),
		itemsCount(CountSnapshotFDs, snFDs),
	}
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return []string{"cannot read mountinfo: " + err.Error()}
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.FSType+" "+m.Mountpoint)
	}
	slices.Sort(out)
	return out
}

// loopsUnder lists the loop devices backed by a file below dir.
func loopsUnder(dir string) []string {
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if f := strings.TrimSpace(string(data)); err == nil && strings.HasPrefix(f, dir+"/") {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(p)))+" "+f)
		}
	}
	return out
}

// dirEntries lists the paths depth levels below dir (1: its entries).
func dirEntries(dir string, depth int) []string {
	pattern := dir
	for range depth {
		pattern = filepath.Join(pattern, "*")
	}
	out, _ := filepath.Glob(pattern)
	return out
}

// shimSockets lists the task servers' sockets in dir, not the spare's,
// which is containerd's for its next task.
func shimSockets(dir string) []string {
	return slices.DeleteFunc(dirEntries(dir, 1), func(p string) bool {
		return strings.HasPrefix(filepath.Base(p), spare.SocketPrefix)
	})
}

// stagedDirs lists the snapshot dirs that stage a container: a chain's
// (chain.json) or an ordinary image's filesystem (rootfs.json).
func stagedDirs(dir string) []string {
	var out []string
	for _, d := range dirEntries(dir, 1) {
		for _, marker := range []string{"chain.json", "rootfs.json"} {
			if _, err := os.Lstat(filepath.Join(d, marker)); err == nil {
				out = append(out, d+" ("+marker+")")
			}
		}
	}
	return out
}

// flatLinks adds up the link counts of the snapshotter's flat files: one
// for the cache's own name, one per staged hard link.
func flatLinks(dir string) Count {
	c := Count{Name: CountFlatLinks}
	for _, p := range dirEntries(dir, 1) {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			continue
		}
		c.Value += int(st.Nlink)
		c.Items = append(c.Items, fmt.Sprintf("%s nlink=%d", p, st.Nlink))
	}
	return c
}

// cgroupsOf lists the cgroups below /<namespace> in every hierarchy, where
// containerd's default spec puts a task's cgroup.
func cgroupsOf(namespace string) []string {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return []string{"cannot read mountinfo: " + err.Error()}
	}
	var out []string
	for _, m := range mounts {
		top := filepath.Join(m.Mountpoint, namespace)
		_ = filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && path != top {
				out = append(out, path)
			}
			return nil
		})
	}
	slices.Sort(out)
	return slices.Compact(out)
}
