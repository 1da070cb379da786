package vm

import (
	"fmt"
	"path"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// bindSources is where the guest keeps the copies of host files that the
// spec bind-mounts into the container (a file, a Kubernetes live volume, a
// tmpfs's root: the rest of the directories are shared, shareSources), a
// snapshot of its source taken at create.
const bindSources = "/run/cocoon/binds"

// podBindSources is where a pod's VM keeps the copies of the directories
// its containers bind, one per host directory (sharedDirs).
const podBindSources = bindSources + "/.pod"

// memberBindSources is where a pod's VM keeps the copies of the files one
// container binds, and its image volumes' mount points: the pod's VM
// outlives the container, so they are removed when it goes (member.release).
func memberBindSources(id string) string {
	return path.Join(bindSources, id)
}

// guestFiles are the files CRI and nerdctl bind-mount into a container for
// its identity on the network; without a container root the guest's own
// are replaced.
var guestFiles = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/hostname"}

// kernelMounts are the mount types the guest mounts itself, as the spec says.
var kernelMounts = []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2"}

// guestNetwork is what the guest needs to impersonate iface.
func guestNetwork(iface *network.Interface) *agent.Network {
	if iface == nil {
		return nil
	}
	n := &agent.Network{MAC: iface.MAC, MTU: iface.MTU, Addresses: iface.Addrs}
	for _, r := range iface.Routes {
		n.Routes = append(n.Routes, agent.Route{Dst: r.Dst, Gateway: r.Gw, Source: r.Src, Metric: uint32(r.Metric), OnLink: r.OnLink})
	}
	return n
}

// guestMounts are a container's mounts as a VM of its own takes them: the
// files Init writes (the copies of bind sources), its root with the
// spec's mounts inside it, the copies of directories among the files (by
// host directory), and the directories it binds that the VM sees live,
// to serve before Init.
type guestMounts struct {
	files  []agent.File
	root   *agent.Rootfs
	copied map[string]string
	shares map[shareKey]*dirShare
}

// guestSetup is what Init gives the guest besides its identity and
// network: for an ordinary image its root (the disk with the image's
// layers) and the spec's mounts, copies taken from copies and shares
// placed in shares (nil: directories are copied too); for a snapshot
// image the identity files alone.
func guestSetup(spec *specs.Spec, disk *chain.StagedRootfs, copies *copyBudget, shares *vmShares) (guestMounts, error) {
	var mounts []specs.Mount
	if spec != nil {
		mounts = spec.Mounts
	}
	if disk == nil {
		files, err := identityFiles(mounts)
		return guestMounts{files: files, root: guestRootConfinement(spec)}, err
	}
	b := binds{budget: copies, vm: shares}
	root := &agent.Rootfs{FSType: disk.FSType, Serial: hypervisor.RootfsSerial, Size: disk.ImageSize()}
	if spec != nil {
		root.Readonly = spec.Root != nil && spec.Root.Readonly
		if spec.Linux != nil {
			root.MaskedPaths, root.ReadonlyPaths = spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths
		}
	}
	for _, m := range mounts {
		gm, err := b.translate(m)
		if err != nil {
			return guestMounts{}, fmt.Errorf("mount at %s: %w", m.Destination, err)
		}
		root.Mounts = append(root.Mounts, gm...)
	}
	if err := copies.take(b.used); err != nil {
		return guestMounts{}, err
	}
	return guestMounts{files: b.files, root: root, copied: b.copied, shares: b.shares}, nil
}

// guestRootConfinement confines a snapshot image's processes, which run
// in the guest's own root, when the spec asks for a read-only root: in a
// mount namespace of their own where it is, with the spec's masked and
// read-only paths (a Rootfs without a disk). Without that ask it is nil
// and they share the agent's view, as the VM is the container (the
// masked and read-only paths alone would cost every start a namespace). A
// pod's sandbox gets none: containerd's CRI asks a read-only root for its
// pause process, which writes nothing, and the pod's start would pay for
// it.
func guestRootConfinement(spec *specs.Spec) *agent.Rootfs {
	if spec == nil || spec.Root == nil || !spec.Root.Readonly || task.IsPodSandbox(spec) {
		return nil
	}
	root := &agent.Rootfs{Readonly: true}
	if spec.Linux != nil {
		root.MaskedPaths, root.ReadonlyPaths = spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths
	}
	return root
}

// identityFiles copies the resolver, hosts and hostname files the spec
// bind-mounts over the guest's own: a snapshot image's processes run in
// the guest's root.
func identityFiles(mounts []specs.Mount) ([]agent.File, error) {
	var files []agent.File
	for _, m := range mounts {
		if !isBindMount(m) || !slices.Contains(guestFiles, path.Clean(m.Destination)) {
			continue
		}
		data, mode, err := readHostFile(m.Source)
		if err != nil {
			return nil, fmt.Errorf("bind mount at %s: %w", m.Destination, err)
		}
		files = append(files, agent.File{Path: path.Clean(m.Destination), Data: data, Mode: mode})
	}
	return files, nil
}

// podPause is the process r's VM prepares: for the pause of a pod's
// sandbox made by containerd's CRI, the guest's own pause (agent/pause) in
// place of the pause image's, with the rest of the pause's spec (user,
// capabilities, seccomp, PID namespace). The pause image holds one program
// that waits for a signal; mounting it would cost every pod start its
// disk's probe and mounts.
func podPause(r task.LaunchRequest) *agent.ExecRequest {
	if r.Process == nil || !task.IsCRIPause(r.Spec) {
		return r.Process
	}
	p := *r.Process
	p.Args, p.Cwd = []string{pause.Path}, "/"
	return &p
}
