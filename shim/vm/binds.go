package vm

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/fsmode"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/share"
)

// binds collects the copies of the host files and trees a container's
// bind mounts show.
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

// copy adds the regular file, or the directory tree, at host path src to
// the guest at dst. src is the spec's host path, resolved as any; nothing
// under it is followed. Each entry is opened O_PATH|O_NOFOLLOW and its
// type read from that handle, so a device, FIFO or socket is refused
// without being opened; a regular file is then opened for reading through
// the handle. Directories are copied, empty ones too, with their
// permission bits. A symbolic link is made a link in the guest (a
// Kubernetes volume's keys are links through its ..data link, which a
// live update swaps): it keeps its target when that resolves inside src,
// else gets a target inside the copy, where src's root would take it (an
// absolute target relative to the root, ".." stopped at the root). So no
// host file outside src is ever read, nor reached from the guest. A
// directory that is the root of a tmpfs is a tmpfs of the same size in
// the guest.
func (b *binds) copy(src, dst string) error {
	root, err := unix.Open(src, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(root)
	first := len(b.files)
	w := walk{binds: b, root: src, rootFD: root}
	if err := w.add(root, ".", dst); err != nil {
		return err
	}
	if !b.files[first].Mode.IsDir() {
		return nil
	}
	size, err := tmpfsSize(root)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	b.files[first].TmpfsSize = size
	return nil
}

// tmpfsSize is the size of the tmpfs whose root is the directory open
// (O_PATH) as fd, as a memory-backed emptyDir is (kubelet mounts it with
// its sizeLimit); 0 for any other.
func tmpfsSize(fd int) (int64, error) {
	var fsStat unix.Statfs_t
	if err := unix.Fstatfs(fd, &fsStat); err != nil {
		return 0, fmt.Errorf("statfs: %w", err)
	}
	if fsStat.Type != unix.TMPFS_MAGIC {
		return 0, nil
	}
	var st, parent unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	if err := unix.Fstatat(fd, "..", &parent, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, fmt.Errorf("stat its parent: %w", err)
	}
	if st.Dev == parent.Dev {
		return 0, nil
	}
	return int64(fsStat.Blocks) * fsStat.Bsize, nil
}

// walk is one copy of a tree: its host root, by path and by handle.
type walk struct {
	*binds
	root   string
	rootFD int
}

// hostPath names the entry at rel under the root in messages.
func (w walk) hostPath(rel string) string {
	return filepath.Join(w.root, rel)
}

// add adds the entry open (O_PATH) as fd, at rel under the root, to the
// guest at dst.
func (w walk) add(fd int, rel, dst string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", w.hostPath(rel), err)
	}
	perm := fs.FileMode(st.Mode) & fs.ModePerm
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := w.charge(copyUsage{files: 1, bytes: st.Size}); err != nil {
			return err
		}
		// A file that grew since its stat (a log being written) is read
		// as far as the bound lets it.
		data, err := readOpened(fd, w.hostPath(rel), st.Size+w.budget.room(w.used))
		if err != nil {
			return err
		}
		w.used.bytes += int64(len(data)) - st.Size
		w.files = append(w.files, agent.File{Path: dst, Data: data, Mode: perm})
	case unix.S_IFDIR:
		if err := w.charge(copyUsage{files: 1}); err != nil {
			return err
		}
		w.files = append(w.files, agent.File{Path: dst, Mode: fs.ModeDir | perm})
		return w.children(fd, rel, dst)
	case unix.S_IFLNK:
		if err := w.charge(copyUsage{files: 1}); err != nil {
			return err
		}
		target, err := w.linkTarget(fd, rel)
		if err != nil {
			return err
		}
		w.files = append(w.files, agent.File{Path: dst, Data: []byte(target), Mode: fs.ModeSymlink | fs.ModePerm})
	default:
		return fmt.Errorf("%s is a %s: a cocoon VM takes copies of regular files, directories and symbolic links only: %w", w.hostPath(rel), fsmode.TypeName(fsmode.FromStat(st.Mode)), errdefs.ErrInvalidArgument)
	}
	return nil
}

// charge counts u as copied, failing when the VM cannot hold it besides
// what it holds.
func (w walk) charge(u copyUsage) error {
	if err := w.budget.fits(w.used.plus(u)); err != nil {
		return err
	}
	w.used = w.used.plus(u)
	return nil
}

// children adds the entries of the directory open (O_PATH) as dir, in
// name order.
func (w walk) children(dir int, rel, dst string) error {
	lfd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", w.hostPath(rel), err)
	}
	d := os.NewFile(uintptr(lfd), w.hostPath(rel))
	// One more than may be copied tells a directory too large to copy
	// without listing all of it.
	names, err := d.Readdirnames(w.budget.limit.files + 1)
	d.Close()
	if err != nil && err != io.EOF {
		return fmt.Errorf("list directory %s: %w", w.hostPath(rel), err)
	}
	slices.Sort(names)
	for _, name := range names {
		fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", w.hostPath(path.Join(rel, name)), err)
		}
		err = w.add(fd, path.Join(rel, name), path.Join(dst, name))
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// linkTarget is the target the guest's copy of the link open (O_PATH|
// O_NOFOLLOW) as fd, at rel under the root, gets: its own if the kernel
// resolves it beneath the root (the copy holds the same tree, so the guest
// resolves it the same), else the path, relative to the link, where the
// root would take it, as securejoin resolves it (reading links only, inside
// the root). Neither resolution opens anything but O_PATH handles.
func (w walk) linkTarget(fd int, rel string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", fmt.Errorf("read link %s: %w", w.hostPath(rel), err)
	}
	if n == len(buf) {
		return "", fmt.Errorf("link %s: target longer than %d bytes: %w", w.hostPath(rel), unix.PathMax-1, errdefs.ErrInvalidArgument)
	}
	target := string(buf[:n])
	inside, err := unix.Openat2(w.rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == nil {
		unix.Close(inside)
		return target, nil
	}
	resolved, err := securejoin.SecureJoin(w.root, rel)
	if err != nil {
		return "", fmt.Errorf("link %s -> %s: resolve inside the bind source: %w: %w", w.hostPath(rel), target, err, errdefs.ErrInvalidArgument)
	}
	return filepath.Rel(filepath.Join(w.root, path.Dir(rel)), resolved)
}

// readHostFile reads the regular file at host path p, without opening
// anything else.
func readHostFile(p string) ([]byte, fs.FileMode, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, 0, fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, 0, fmt.Errorf("%s is a %s, expected a regular file: %w", p, fsmode.TypeName(fsmode.FromStat(st.Mode)), errdefs.ErrInvalidArgument)
	}
	data, err := readOpened(fd, p, api.MaxFileSize)
	return data, fs.FileMode(st.Mode) & fs.ModePerm, err
}

// readOpened reads the regular file open (O_PATH) as fd, named p, through
// a new descriptor of the same file: at most max bytes.
func readOpened(fd int, p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes: too large to copy into a VM: %w", p, max, errdefs.ErrInvalidArgument)
	}
	return data, nil
}

func isBindMount(m specs.Mount) bool {
	return m.Type == "bind" || m.Type == "rbind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
