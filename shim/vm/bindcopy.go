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
	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/fsmode"
)

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
