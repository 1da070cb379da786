package vm

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// bindSources is where the guest keeps the copies of host files that the
// spec bind-mounts into the container: a VM shares no file system with the
// host (no 9p, and virtio-fs would need shared guest memory, which private
// mmap restores cannot give), so a bind mount is honoured as a read-only
// snapshot of its source, taken at create.
const bindSources = "/run/cocoon/binds"

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

// guestSetup is what Init gives the guest besides its identity and network:
// the files the spec bind-mounts, and for an ordinary image its root (the
// disk with the image's layers) with the spec's mounts inside it.
func guestSetup(spec *specs.Spec, disk *chain.StagedRootfs) ([]agent.File, *agent.Rootfs, error) {
	var mounts []specs.Mount
	if spec != nil {
		mounts = spec.Mounts
	}
	if disk == nil {
		files, err := identityFiles(mounts)
		return files, nil, err
	}
	b := binds{}
	root := &agent.Rootfs{FSType: disk.FSType, Serial: hypervisor.RootfsSerial}
	for _, m := range mounts {
		gm, err := b.translate(m)
		if err != nil {
			return nil, nil, fmt.Errorf("mount at %s: %w", m.Destination, err)
		}
		root.Mounts = append(root.Mounts, gm)
	}
	return b.files, root, nil
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
		data, mode, err := readSmallFile(m.Source)
		if err != nil {
			return nil, fmt.Errorf("bind mount at %s: %w", m.Destination, err)
		}
		files = append(files, agent.File{Path: path.Clean(m.Destination), Data: data, Mode: mode})
	}
	return files, nil
}

// binds collects the host files a container's bind mounts show.
type binds struct {
	files []agent.File
	n     int
}

// translate turns one spec mount into the guest's.
func (b *binds) translate(m specs.Mount) (specs.Mount, error) {
	if !isBindMount(m) {
		if !slices.Contains(kernelMounts, m.Type) {
			return specs.Mount{}, fmt.Errorf("mount type %q: a cocoon VM mounts %v and bind mounts: %w", m.Type, kernelMounts, errdefs.ErrNotImplemented)
		}
		return m, nil
	}
	st, err := os.Stat(m.Source)
	if err != nil {
		return specs.Mount{}, fmt.Errorf("bind source: %w", err)
	}
	switch {
	case path.Clean(m.Destination) == "/dev/shm" && st.IsDir():
		// The pod's shared memory is shared with no other VM: the
		// container gets its own.
		return specs.Mount{Destination: m.Destination, Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "noexec", "mode=1777"}}, nil
	case st.Mode().IsRegular(), st.IsDir():
		src := path.Join(bindSources, fmt.Sprint(b.n))
		b.n++
		if err := b.copy(m.Source, src); err != nil {
			return specs.Mount{}, err
		}
		m.Source, m.Type = src, "bind"
		return m, nil
	}
	return specs.Mount{}, fmt.Errorf("bind source %s is a %v: a cocoon VM takes copies of regular files and small directories only: %w", m.Source, st.Mode().Type(), errdefs.ErrNotImplemented)
}

// copy adds the regular file, or the regular files under the directory,
// at host path src to the guest at dst. Symbolic links are followed (a
// Kubernetes volume's files are links into a versioned directory); the
// agent's limits on files bound what a container may take this way.
func (b *binds) copy(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			// A link to a directory is walked where it points, inside src.
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				return nil
			}
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if len(b.files) >= api.MaxFiles {
			return fmt.Errorf("bind source %s: more than %d files: too many to copy into a VM: %w", src, api.MaxFiles, errdefs.ErrInvalidArgument)
		}
		data, mode, err := readSmallFile(p)
		if err != nil {
			return err
		}
		b.files = append(b.files, agent.File{Path: path.Join(dst, filepath.ToSlash(rel)), Data: data, Mode: mode})
		return nil
	})
}

// readSmallFile reads a regular file of at most api.MaxFileSize bytes
// without blocking on a FIFO.
func readSmallFile(p string) ([]byte, fs.FileMode, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%s is a %v, not a regular file: %w", p, st.Mode().Type(), errdefs.ErrInvalidArgument)
	}
	data, err := io.ReadAll(io.LimitReader(f, api.MaxFileSize+1))
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", p, err)
	}
	if len(data) > api.MaxFileSize {
		return nil, 0, fmt.Errorf("%s is larger than %d bytes: too large to copy into a VM: %w", p, api.MaxFileSize, errdefs.ErrInvalidArgument)
	}
	return data, st.Mode().Perm(), nil
}

func isBindMount(m specs.Mount) bool {
	return m.Type == "bind" || m.Type == "rbind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
