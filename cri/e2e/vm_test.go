package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// cocoonShim is the cocoon shim's task server binary name.
const cocoonShim = "cocoon-shim-server"

// proc is one process's pid, parent and command line.
type proc struct {
	pid, ppid int
	args      []string
	cwd       string
}

func processes() []proc {
	var out []proc
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		stat, serr := os.ReadFile(filepath.Join("/proc", de.Name(), "stat"))
		if err != nil || serr != nil || len(cmdline) == 0 {
			continue
		}
		// stat: pid (comm) state ppid ...; comm may hold spaces.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cwd, _ := os.Readlink(filepath.Join("/proc", de.Name(), "cwd"))
		out = append(out, proc{pid: pid, ppid: ppid, args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"), cwd: cwd})
	}
	return out
}

// serves reports whether p is a cocoon shim serving one of ids (its -id,
// or the bundle it runs in).
func (p proc) serves(ids []string) bool {
	if filepath.Base(p.args[0]) != cocoonShim {
		return false
	}
	if i := slices.Index(p.args, "-id"); i >= 0 && i+1 < len(p.args) && slices.Contains(ids, p.args[i+1]) {
		return true
	}
	return slices.Contains(ids, filepath.Base(p.cwd))
}

// names reports whether p's command line names one of ids.
func (p proc) names(ids []string) bool {
	return slices.ContainsFunc(p.args, func(a string) bool {
		return slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(a, id) })
	})
}

// vms lists the QEMU processes of a pod: those whose parent is a cocoon
// shim serving the pod's sandbox or one of its containers (ids), or whose
// command line names one of them.
func vms(ids ...string) []int {
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == "" })
	all := processes()
	var shims []int
	for _, p := range all {
		if p.serves(ids) {
			shims = append(shims, p.pid)
		}
	}
	var out []int
	for _, p := range all {
		if strings.HasPrefix(filepath.Base(p.args[0]), "qemu-system") && (slices.Contains(shims, p.ppid) || p.names(ids)) {
			out = append(out, p.pid)
		}
	}
	return out
}

// shimsOf lists the cocoon shims serving ids.
func shimsOf(ids ...string) []int {
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == "" })
	var out []int
	for _, p := range processes() {
		if p.serves(ids) {
			out = append(out, p.pid)
		}
	}
	return out
}

// oneVM checks that exactly one VM runs for pod p with its container ctr,
// and returns its pid.
func oneVM(t *testing.T, p *pod, ctr string) int {
	t.Helper()
	pids := vms(p.id, ctr)
	if len(pids) != 1 {
		t.Fatalf("pod %s with one container runs %d VMs (%v), want exactly 1", p.name, len(pids), pids)
	}
	return pids[0]
}

// bundle is a task's bundle dir in the node's containerd state.
func (n *node) bundle(id string) string {
	return filepath.Join(n.stack.State, "io.containerd.runtime.v2.task", devstack.CRINamespace, id)
}

// report reads container id's restore report from its bundle.
func (n *node) report(t *testing.T, id string) *state.Report {
	t.Helper()
	r, err := state.ReadReport(n.bundle(id))
	if err != nil {
		t.Fatalf("restore report of %s: %v", id, err)
	}
	return r
}

// activeSnapshots lists the cocoon snapshotter's active snapshots (the
// containers' staged rootfs).
func (n *node) activeSnapshots(t *testing.T) []string {
	t.Helper()
	cl, err := n.stack.Client()
	if err != nil {
		t.Fatal(err)
	}
	var active []string
	err = cl.SnapshotService(devstack.Snapshotter).Walk(context.Background(), func(_ context.Context, i snapshots.Info) error {
		if i.Kind == snapshots.KindActive {
			active = append(active, i.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the cocoon snapshotter: %v", err)
	}
	return active
}

// taps lists the tap devices in the node's network namespace.
func (n *node) taps(t *testing.T) []string {
	t.Helper()
	var out []string
	err := n.net.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Type() == "tuntap" {
				out = append(out, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cniResults lists the CNI result files libcni keeps for pod id (in its
// fixed cache dir: containerd's CRI plugin has no setting for it).
func cniResults(id string) []string {
	files, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", fmt.Sprintf("*-%s-*", id)))
	return files
}
