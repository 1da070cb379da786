package vm

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/fsmode"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/share"
)

// binds turns a container's bind mounts into the guest's: shares of host
// directories, copies of the rest (bindcopy.go), image volumes on disks.
type binds struct {
	// dir is where the copies go in the guest; bindSources when "".
	dir   string
	files []agent.File
	// budget bounds the copies with those the VM holds already; used is
	// what files take of it.
	budget *copyBudget
	used   copyUsage
	n      int
	// pod, when set, holds the pod's copies of directories: a directory
	// another container of the pod binds is bound again, not copied, and
	// a new one is copied where the pod keeps it.
	pod *sharedDirs
	// copied are the directories copied, by host path, and their copies.
	copied map[string]string
	// vm serves the directories the VM sees live (nil: it copies them),
	// and shares are those the container binds, to serve before the
	// guest creates it.
	vm     *vmShares
	shares map[shareKey]*dirShare
	// images are the image volumes the guest mounts from disks; only a
	// pod's VM has the disk slots, elsewhere an image volume is copied.
	images []imageVolume
	// mounts are the host's mounts once hostMounts read them.
	mounts []*mountinfo.Info
}

// translate turns one spec mount into the guest's: one mount, and for a
// read-only bind of a directory with mounts under it, a read-write bind
// of each, as runc leaves them (ro is not recursive; rro is).
func (b *binds) translate(m specs.Mount) ([]specs.Mount, error) {
	gm, err := b.translateOne(m)
	if err != nil {
		return nil, err
	}
	out := []specs.Mount{gm}
	if isBindMount(m) && gm.Type == "bind" && slices.Contains(m.Options, "ro") {
		subs, err := b.submounts(m.Source)
		if err != nil {
			return nil, err
		}
		for _, rel := range subs {
			out = append(out, specs.Mount{Destination: path.Join(m.Destination, rel), Type: "bind",
				Source: path.Join(gm.Source, rel), Options: []string{"rbind", "rw"}})
		}
	}
	return out, nil
}

// hostMounts are the host's mounts, read once for all of a container's
// binds: mountinfo is long on a busy node, and the restore waits for it.
func (b *binds) hostMounts() ([]*mountinfo.Info, error) {
	if b.mounts == nil {
		infos, err := mountinfo.GetMounts(nil)
		if err != nil {
			return nil, fmt.Errorf("read the host's mounts: %w", err)
		}
		b.mounts = infos
	}
	return b.mounts, nil
}

// submounts are the mount points under directory src, relative to it, in
// mount order; the copy of src holds their content.
func (b *binds) submounts(src string) ([]string, error) {
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return nil, fmt.Errorf("bind source: %w", err)
	}
	infos, err := b.hostMounts()
	if err != nil {
		return nil, err
	}
	var rels []string
	for _, mi := range infos {
		rel, err := filepath.Rel(real, mi.Mountpoint)
		if err == nil && rel != "." && !strings.HasPrefix(rel, "../") && rel != ".." && !slices.Contains(rels, rel) {
			rels = append(rels, rel)
		}
	}
	return rels, nil
}

func (b *binds) translateOne(m specs.Mount) (specs.Mount, error) {
	if !isBindMount(m) {
		if !slices.Contains(kernelMounts, m.Type) {
			return specs.Mount{}, fmt.Errorf("mount of type %q from %q: a cocoon VM takes bind mounts and mounts of type %v only: %w", m.Type, m.Source, kernelMounts, errdefs.ErrInvalidArgument)
		}
		return m, nil
	}
	if slices.ContainsFunc(m.Options, isSharedPropagation) {
		return specs.Mount{}, fmt.Errorf("bind of %s asks for shared propagation (Kubernetes' mountPropagation: Bidirectional), that a mount the container makes there show on the host: a mount in a VM is its kernel's own and cannot; use HostToContainer (rslave), under which what the host mounts there shows in a pod's VM: %w",
			m.Source, errdefs.ErrInvalidArgument)
	}
	// Stat, never open: the source may be a FIFO or a device.
	st, err := os.Stat(m.Source)
	if err != nil {
		return specs.Mount{}, fmt.Errorf("bind source: %w", err)
	}
	switch {
	case path.Clean(m.Destination) == "/dev/shm" && st.IsDir():
		// The pod's shared memory is shared with no other VM: the
		// container gets its own.
		return specs.Mount{Destination: m.Destination, Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "noexec", "mode=1777"}}, nil
	case st.IsDir() && b.pod != nil:
		if img, ok := b.stagedImage(m.Source); ok {
			return b.imageMount(m, img), nil
		}
		return b.podDir(m)
	case st.IsDir():
		if ok, err := b.shareable(m.Source); err != nil || ok {
			if err != nil {
				return specs.Mount{}, err
			}
			return b.shareDir(m), nil
		}
		return b.copyOwn(m, true)
	case st.Mode().IsRegular():
		return b.copyOwn(m, false)
	}
	return specs.Mount{}, fmt.Errorf("bind source %s is a %s: a cocoon VM takes copies of regular files and directories only: %w", m.Source, fsmode.TypeName(st.Mode()), errdefs.ErrInvalidArgument)
}

// copyOwn copies bind source m.Source, a directory (isDir) or a file,
// under the container's own directory.
func (b *binds) copyOwn(m specs.Mount, isDir bool) (specs.Mount, error) {
	dir := b.dir
	if dir == "" {
		dir = bindSources
	}
	src := path.Join(dir, fmt.Sprint(b.n))
	b.n++
	if err := b.copy(m.Source, src); err != nil {
		return specs.Mount{}, fmt.Errorf("copy bind source %s: %w", m.Source, err)
	}
	if isDir {
		b.keepCopy(m.Source, src)
	}
	m.Source, m.Type, m.Options = src, "bind", copyOptions(m.Options)
	return m, nil
}

// podDir binds the pod's copy of directory m.Source, copying it in the
// first time a container of the pod binds it.
func (b *binds) podDir(m specs.Mount) (specs.Mount, error) {
	host := filepath.Clean(m.Source)
	if ok, err := b.shareable(host); err != nil || ok {
		if err != nil {
			return specs.Mount{}, err
		}
		return b.shareDir(m), nil
	}
	src, ok := b.pod.find(host)
	if !ok {
		if src, ok = b.copied[host]; !ok {
			src = b.pod.place()
			if err := b.copy(m.Source, src); err != nil {
				return specs.Mount{}, fmt.Errorf("copy bind source %s: %w", m.Source, err)
			}
			b.keepCopy(host, src)
		}
	}
	m.Source, m.Type, m.Options = src, "bind", copyOptions(m.Options)
	return m, nil
}

// isSharedPropagation says whether a mount option asks for shared
// propagation.
func isSharedPropagation(opt string) bool { return opt == "shared" || opt == "rshared" }

// shareable says whether the pod's VM sees host directory dir live
// (vmShares) rather than a copy: when the guest can, unless it is a
// Kubernetes volume kept in step (liveVolume: kubelet swaps a new version
// in whole, which a copy shows as whole) or a tmpfs's root (a
// memory-backed emptyDir, a tmpfs in the guest).
func (b *binds) shareable(dir string) (bool, error) {
	if b.vm == nil || liveVolume.MatchString(dir) {
		return false, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open bind source %s: %w", dir, err)
	}
	defer unix.Close(fd)
	size, err := tmpfsSize(fd)
	if err != nil {
		return false, fmt.Errorf("bind source %s: %w", dir, err)
	}
	return size == 0, nil
}

// shareDir binds the VM's share of directory m.Source, with the bind's
// access.
func (b *binds) shareDir(m specs.Mount) specs.Mount {
	k := shareKey{host: filepath.Clean(m.Source), access: share.ReadWrite}
	switch {
	case slices.Contains(m.Options, "rro"):
		k.access = share.RecursiveReadOnly
	case slices.Contains(m.Options, "ro"):
		k.access = share.ReadOnly
	}
	sh := b.vm.place(k)
	if b.shares == nil {
		b.shares = map[shareKey]*dirShare{}
	}
	b.shares[k] = sh
	m.Source, m.Type, m.Options = sh.guest, "bind", copyOptions(m.Options)
	return m
}

// keepCopy records that host directory src is copied to guest.
func (b *binds) keepCopy(src, guest string) {
	if b.copied == nil {
		b.copied = map[string]string{}
	}
	b.copied[filepath.Clean(src)] = guest
}

// copyOptions are a bind's options for its copy: a copy is one tree with
// no mounts under it, so a recursive read-only bind (rro) is a read-only
// one there.
func copyOptions(opts []string) []string {
	out := slices.Clone(opts)
	for i, o := range out {
		if o == "rro" {
			out[i] = "ro"
		}
	}
	return out
}

func isBindMount(m specs.Mount) bool {
	return m.Type == "bind" || m.Type == "rbind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
