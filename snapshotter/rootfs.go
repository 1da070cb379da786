package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// imageFunc builds the filesystem image of the ordinary layers whose files
// dirs are layers (newest first) and publishes it at out.
type imageFunc func(ctx context.Context, layers []string, out string) error

// mkfsErofs is the image builder (Debian's erofs-utils).
const mkfsErofs = "mkfs.erofs"

// imageBuilder builds rootfs images with mkfs.erofs, uncompressed: the
// guest reads it at block-device speed with no decompression, and it builds
// fastest. mkfs.erofs 1.5 reads a directory only, so a chain of several
// layers is built from a read-only overlay mount of them.
type imageBuilder struct {
	mntDir   string   // build mount points; emptied at start
	layerDir string   // lower dirs are given to overlay relative to this dir
	options  []string // overlay mount options
	maxSize  int64    // bound on the files' total size; 0 = none
}

func (b imageBuilder) build(ctx context.Context, layers []string, out string) error {
	f, err := chain.CreateTemp(out)
	if err != nil {
		return fmt.Errorf("build rootfs image: %w", err)
	}
	convert := func(dir string) error {
		if err := b.checkTree(dir); err != nil {
			return err
		}
		return runMkfs(ctx, f.Name(), dir)
	}
	if len(layers) == 1 {
		err = convert(layers[0])
	} else {
		err = b.withMergedLayers(layers, convert)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("build rootfs image of %d layers: %w", len(layers), err)
	}
	if err := chain.PublishUnsynced(f, out); err != nil {
		return fmt.Errorf("build rootfs image: %w", err)
	}
	return nil
}

// maxNameLen is the longest file name mkfs.erofs 1.5 (Debian 12) builds
// right: it cuts a longer one to 254 bytes, then fails to find the file
// ("Could not format the device: No such file or directory", naming no
// file) or, beside a file that has the shorter name, builds an image with
// two entries of that name and the longer file's content lost.
const maxNameLen = 254

// checkTree refuses a tree mkfs.erofs would not build right: a file name
// longer than maxNameLen, or files that add up to more than b.maxSize
// (their sizes count in full, holes included, as the image stores them).
func (b imageBuilder) checkTree(dir string) error {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		if len(d.Name()) > maxNameLen {
			return fmt.Errorf("a file name of %d bytes (at %s): mkfs.erofs builds names of up to %d bytes: %w", len(d.Name()), strings.TrimPrefix(p, dir), maxNameLen, errdefs.ErrInvalidArgument)
		}
		if b.maxSize <= 0 || !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if total += info.Size(); total > b.maxSize {
			return fmt.Errorf("its files add up to more than snapshotter.max_rootfs_size, %d bytes (at %s): %w", b.maxSize, strings.TrimPrefix(p, dir), errdefs.ErrInvalidArgument)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check the layers: %w", err)
	}
	return nil
}

// runMkfs writes the erofs image of src into the existing file out. The
// mkfs dies with the thread that started it, so a crash of the snapshotter
// leaves only a temp file, which the next start removes. The thread stays
// locked until mkfs exits: a thread the runtime gives to another goroutine
// may be one that locks it and exits, which would kill mkfs early.
func runMkfs(ctx context.Context, out, src string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.CommandContext(ctx, mkfsErofs, "--quiet", out, src)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", mkfsErofs, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// withMergedLayers mounts layers (newest first) as one read-only overlay and
// calls fn with the mount point. The mount is made in a private mount
// namespace of one thread, which fn's child processes inherit: no other
// process sees it, and it vanishes with the thread even if the snapshotter
// crashes before unmounting.
func (b imageBuilder) withMergedLayers(layers []string, fn func(dir string) error) error {
	mp, err := os.MkdirTemp(b.mntDir, "build-")
	if err != nil {
		return fmt.Errorf("create build mount point: %w", err)
	}
	defer os.Remove(mp)
	lowers := make([]string, len(layers))
	for i, l := range layers {
		// Relative names keep the mount data under its one-page limit.
		if rel, err := filepath.Rel(b.layerDir, l); err == nil && !strings.HasPrefix(rel, "..") {
			l = rel
		}
		lowers[i] = l
	}
	data := strings.Join(append([]string{"lowerdir=" + strings.Join(lowers, ":")}, b.options...), ",")
	return inPrivateMountNS(b.layerDir, func() error {
		if err := unix.Mount("overlay", mp, "overlay", unix.MS_RDONLY, data); err != nil {
			return fmt.Errorf("mount %d layers read-only: %w", len(layers), err)
		}
		defer unix.Unmount(mp, unix.MNT_DETACH)
		return fn(mp)
	})
}

// inPrivateMountNS runs fn on a thread of its own in a new mount namespace
// that propagates nothing to the host, with dir as its working directory.
// The thread is never returned to the scheduler: it exits with fn, and the
// namespace with it.
func inPrivateMountNS(dir string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			if err := unix.Chdir(dir); err != nil {
				return fmt.Errorf("chdir %s: %w", dir, err)
			}
			return fn()
		}()
	}()
	return <-errc
}

// cleanBuildMounts unmounts and removes the build mount points a crash
// left in dir. Only at startup: a running build uses its mount point.
// Mount points are removed, never their contents: if an unmount failed,
// a recursive removal would delete layer files through it.
func cleanBuildMounts(ctx context.Context, dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read build mount dir: %w", err)
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if mounted, err := mountinfo.Mounted(p); err == nil && mounted {
			log.G(ctx).WithField("path", p).Info("unmounting leftover build mount")
			if err := mount.UnmountRecursive(p, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount leftover build mount %s: %w", p, err)
			}
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove leftover build mount point: %w", err)
		}
	}
	return nil
}
